"""Our token files against `dolma tokens` on the same input: the same tokens and metadata for every document.

Needs a `dolma` executable (the optional `dolma` extra, or OLMO_DATA_DOLMA=/path/to/dolma); skipped without one.
"""

from __future__ import annotations

import csv
import gzip
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from olmo_data.tokenize import TokenizeOptions, tokenize
from tests.data.test_tokenize import read_output

DOLMA = os.environ.get("OLMO_DATA_DOLMA") or shutil.which("dolma")


@pytest.mark.skipif(DOLMA is None, reason="no `dolma` executable (pip install dolma, or set OLMO_DATA_DOLMA)")
def test_same_documents_tokens_and_metadata_as_dolma(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path):
    assert DOLMA is not None
    cmd = [DOLMA, "tokens", "--documents", *demo_corpus[:2], "--destination", str(tmp_path / "dolma")]
    cmd += ["--tokenizer.name_or_path", demo_tokenizer, "--tokenizer.eos_token_id", "0", "--processes", "1"]
    subprocess.run(cmd, check=True, capture_output=True)
    theirs = {}
    for npy in sorted((tmp_path / "dolma").glob("*.npy")):
        tokens = np.memmap(npy, dtype=np.uint16, mode="r")
        with gzip.open(npy.with_suffix(".csv.gz"), "rt", newline="") as f:
            for start, end, doc_id, src, loc in csv.reader(f):
                theirs[doc_id] = (src, int(loc), tokens[int(start) : int(end)].tolist())
    tokenize(demo_corpus[:2], tmp_path / "ours", TokenizeOptions(tokenizer=demo_tokenizer))
    ours = {doc_id: (src, loc, tokens) for doc_id, src, loc, tokens in read_output(tmp_path / "ours")}
    assert len(ours) > 50
    assert ours == theirs
