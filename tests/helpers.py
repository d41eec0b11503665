"""Small helpers for writing test inputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list[Any], *, raw_lines: list[bytes] | None = None) -> str:
    """Write dolma-style JSON lines (gzip when the name ends in .gz); `raw_lines` are appended verbatim."""
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b"".join(raw_lines or [])
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return str(path)


def docs(*texts: str, source: str = "test") -> list[dict[str, Any]]:
    return [{"id": f"doc-{i}", "text": t, "source": source} for i, t in enumerate(texts)]
