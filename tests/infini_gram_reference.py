"""infini-gram (2.6.0, the engine behind OLMoTrace) as the reference for `olmo-data index`: its own index built over
the same token files, asked through its own API. Used by tests/data/suffix_index/test_infini_gram.py and
benchmarks/infini_gram_compare.py; nothing of it is re-implemented here.

Its indexing tokenizes JSON documents itself; here the token files are written in the layout its indexing writes
(`tokenized.0`: each document as a separator of all-ones bytes followed by its tokens, little-endian;
`offset.0`: each document's byte offset as uint64), one document per token file, so that a match never crosses
from one file into the next (as with ours), and then its own suffix-array step (`build_sa`, its bundled Rust
binary) sorts them. A position it reports is (document = token file, token offset in it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

WIDTH = {"uint16": 2, "uint32": 4}


def have_infini_gram() -> bool:
    try:
        import infini_gram.engine  # noqa: F401
    except ImportError:
        return False
    return True


def build_reference(paths: list[str], dtype: str, out: Path, mem_gib: int = 4, cpus: int = 1) -> float:
    """Write the token files as infini-gram's tokenized shard 0 and sort it with its own build_sa; the seconds the
    sort took. A token equal to the separator (all ones) would be read as a document end: refused."""
    import time

    width = WIDTH[dtype]
    out.mkdir(parents=True, exist_ok=True)
    offset = 0
    with open(out / "tokenized.0", "wb") as data, open(out / "offset.0", "wb") as offsets:
        for path in paths:
            tokens = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
            if len(tokens) and int(tokens.max()) == (1 << (8 * width)) - 1:
                raise ValueError(f"{path}: holds infini-gram's document separator {(1 << (8 * width)) - 1}")
            offsets.write(np.array([offset], dtype="<u8").tobytes())
            data.write(b"\xff" * width)
            for a in range(0, len(tokens), 1 << 24):
                data.write(np.asarray(tokens[a : a + (1 << 24)]).tobytes())
            offset += width * (len(tokens) + 1)
    settings = (
        f"save_dir={str(out)!r}, temp_dir={str(out)!r}, shards=1, workers=1, worker_id=0, mem={mem_gib}, "
        f"cpus={cpus}, token_width={width}"
    )
    code = f"import types, infini_gram.indexing as ix; ix.build_sa(types.SimpleNamespace({settings}))"
    t0 = time.perf_counter()  # in its own process: build_sa changes the working directory to find its binary
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (out / "table.0").exists():
        raise RuntimeError(f"infini-gram build_sa failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0


class Reference:
    """infini-gram's engine over a reference index: counts, positions, longest matches and OLMoTrace's spans."""

    def __init__(self, folder: Path, paths: list[str], dtype: str) -> None:
        from infini_gram.engine import InfiniGramEngine

        self.paths = paths
        top = (1 << (8 * WIDTH[dtype])) - 1
        self.engine = InfiniGramEngine(
            index_dir=str(folder),
            eos_token_id=0,
            vocab_size=top,
            token_dtype="u16" if dtype == "uint16" else "u32",
        )

    def count(self, query: list[int]) -> int:
        return int(self.engine.count(input_ids=query)["count"])  # type: ignore[typeddict-item]

    def find(self, query: list[int]) -> dict[str, list[int]]:
        """Every position holding `query`, per token file, sorted."""
        found: dict[str, list[int]] = {p: [] for p in self.paths}
        result = self.engine.find(input_ids=query)
        for shard, (lo, hi) in enumerate(result["segment_by_shard"]):  # type: ignore[typeddict-item]
            if hi > lo:
                # its compiled engine directly: 2.6.0's Python wrapper of this call names a method that is missing
                docs = self.engine.engine.get_docs_by_ranks(
                    list_of_s_and_rank=[(shard, r) for r in range(lo, hi)], max_disp_len=1 << 40
                )
                for doc in docs:
                    found[self.paths[doc.doc_ix]].append(int(doc.needle_offset))
        return {p: sorted(v) for p, v in found.items()}

    def longest(self, query: list[int]) -> list[int]:
        """For each start i, the length of the longest prefix of query[i:] the data holds (from its creativity
        call, which gives the end of that prefix)."""
        ends = self.engine.creativity(input_ids=query)["rs"]  # type: ignore[typeddict-item]
        return [int(r) - i for i, r in enumerate(ends)]

    def spans(self, query: list[int], min_tokens: int) -> list[dict[str, Any]]:
        """OLMoTrace's maximal spans of at least `min_tokens` (no word-boundary rule, no delimiters)."""
        result = self.engine.attribute(
            input_ids=query, delim_ids=[], min_len=min_tokens, max_cnt=1 << 40, enforce_bow=False
        )
        return [{"start": s["l"], "end": s["r"], "count": s["count"]} for s in result["spans"]]
