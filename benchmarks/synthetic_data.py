"""What the benchmarks that build synthetic token directories share: tokenize's document metadata and manifest.

Imported by scripts in this folder (`python benchmarks/NAME.py` puts the folder on the path).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np


def write_document_metadata(path: Path, ends: np.ndarray, file_index: int, source: str) -> int:
    """`start,end,id,src,loc` rows (tokenize's `.csv.gz`) for documents ending at `ends` (the last at the file's
    end), ids `doc-{file_index}-{i}`, all from `source`; returns how many documents."""
    starts = np.concatenate([[0], ends[:-1]])
    rows = "".join(
        f"{s},{e},doc-{file_index}-{i},{source},{i + 1}\n"
        for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
    )
    with gzip.open(path, "wt", compresslevel=1) as g:
        g.write(rows)
    return len(starts)


def write_manifest(directory: Path, dtype: str, entries: list[dict[str, Any]]) -> None:
    manifest = {"format": "olmo-data.tokens", "version": 1, "dtype": dtype, "files": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest))
