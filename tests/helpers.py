"""Small helpers for writing test inputs."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
from collections.abc import Iterator
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


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[bool]:
    """Mount a tmpfs of `size` (e.g. "200k") at `where` when this process may (root, as in CI); yields whether it
    did. Callers without one inject the OSError(ENOSPC) a full disk raises instead, so the test still runs
    (NO_SMALL_DISK=1 runs that variant as root too)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = hasattr(os, "geteuid") and os.geteuid() == 0 and not os.environ.get("NO_SMALL_DISK")
    mounted = (
        mounted
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=True)
