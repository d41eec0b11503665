"""Suffix arrays of token arrays: numpy prefix doubling, or `pydivsufsort` where installed (the `index` extra).

The one module that knows the foreign engine, so the rest of the index never imports it. Both engines sort the
suffixes of the same array (a suffix that is a prefix of another sorts first) and return the same array, so an
index does not depend on which one built it; a test checks that they agree.

Why numpy by default: it needs nothing beyond numpy, and at ~2-3M tokens/s per process (random tokens; fewer
on text with long repeats, which need more doubling rounds) a shard of 16M tokens sorts in seconds; divsufsort
is ~4x faster (BENCHMARKS.md) and is used automatically when importable.
"""

from __future__ import annotations

import numpy as np

ENGINES = ("auto", "numpy", "divsufsort")


def have_divsufsort() -> bool:
    try:
        import pydivsufsort  # noqa: F401
    except ImportError:
        return False
    return True


def engine_name(engine: str) -> str:
    """The engine `engine` ("auto" picks divsufsort when importable) stands for."""
    from olmo_data.errors import DataError

    if engine not in ENGINES:
        raise DataError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if engine == "auto":
        return "divsufsort" if have_divsufsort() else "numpy"
    if engine == "divsufsort" and not have_divsufsort():
        raise DataError("--engine divsufsort: pydivsufsort is not installed (pip install 'olmo-data[index]')")
    return engine


def suffix_array(tokens: np.ndarray, engine: str = "numpy") -> np.ndarray:
    """The start positions of `tokens`' suffixes in lexicographic order of the suffixes (int64)."""
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int64)
    if engine_name(engine) == "divsufsort":
        import pydivsufsort

        values = tokens.astype(np.uint32 if tokens.dtype.itemsize <= 4 else np.uint64, copy=False)
        return np.asarray(pydivsufsort.divsufsort(values), dtype=np.int64)
    return _prefix_doubling(tokens)


def _prefix_doubling(tokens: np.ndarray) -> np.ndarray:
    """Manber-Myers by sorting: round h ranks each suffix by its first 2h tokens, as the pair (rank of its first h,
    rank of the h after them); ranks start at 1 so that 0 (past the end) sorts a shorter suffix first. Stops when
    every rank is distinct, after about log2 of the longest repeat rounds."""
    n = len(tokens)
    if tokens.dtype.itemsize <= 2:
        rank = tokens.astype(np.int64) + 1
        base = 1 << 17
    else:
        _, inverse = np.unique(tokens, return_inverse=True)
        rank = inverse.astype(np.int64).reshape(-1) + 1
        base = n + 2
    h = 1
    while True:
        key = rank * base  # (rank of the first h tokens, rank of the next h) as one int64
        key[: n - h] += rank[h:]
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        del key
        new = np.empty(n, dtype=np.int64)
        new[0] = 1
        np.cumsum(ordered[1:] != ordered[:-1], out=new[1:])
        new[1:] += 1
        del ordered
        rank[order] = new
        if int(new[-1]) == n:
            return order
        h *= 2
        base = n + 2
