"""Suffix arrays of token arrays: numpy prefix doubling, or `pydivsufsort` where installed (the `index` extra).

The one module that knows the foreign engine, so the rest of the index never imports it. Both engines sort the
suffixes of the same array (a suffix that is a prefix of another sorts first) and return the same array, so an
index does not depend on which one built it; a test checks that they agree.

Why numpy as the fallback: it needs nothing beyond numpy, and re-sorting only the groups not yet resolved sorts a
16M-token shard of text-like tokens in ~11 s (~1.5M tokens/s per process); divsufsort is ~2-4.6x faster, and a
build process peaks at about a third of the memory (1.3 GB against 4.1 GB for a 50M-token shard: BENCHMARKS.md),
so `auto` takes it when the `index` extra is installed.
"""

from __future__ import annotations

import numpy as np

ENGINES = ("auto", "numpy", "divsufsort")
_openmp_started = False  # divsufsort ran in this process: its OpenMP threads exist here, in no forked child


def openmp_started() -> bool:
    """Whether this process has sorted with divsufsort: a worker forked from it then waits forever for OpenMP
    threads it did not inherit (the second build of a process, sorting in one process and then in several), so
    such a process starts its workers by spawning them instead."""
    return _openmp_started


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

        global _openmp_started
        _openmp_started = True
        values = tokens.astype(np.uint32 if tokens.dtype.itemsize <= 4 else np.uint64, copy=False)
        return np.asarray(pydivsufsort.divsufsort(values), dtype=np.int64)
    return _prefix_doubling(tokens)


def _prefix_doubling(tokens: np.ndarray) -> np.ndarray:
    """Prefix doubling (Manber-Myers) by sorting, re-sorting only what is not yet in place (as Larsson-Sadakane):
    after round h the array is ordered by each suffix's first 2h tokens, and a suffix's rank is the first slot of
    its group of equal prefixes. A round sorts only the suffixes whose group still holds several, by (rank, rank of
    the suffix h tokens later; -1 past the end, so a shorter suffix sorts first): a group stays where it is and
    only splits. Most groups resolve in a few rounds; long repeats take about log2 of their length."""
    n = len(tokens)
    order = np.argsort(tokens, kind="stable").astype(np.int64)
    first = _runs(tokens[order])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.flatnonzero(first)[np.cumsum(first) - 1]
    slots = np.flatnonzero(_in_groups(first))
    h = 1
    while len(slots):
        p = order[slots]
        later = p + h
        key = rank[p] * (n + 1) + 1
        inside = later < n
        key[inside] += rank[later[inside]]
        key[~inside] -= 1
        by_key = np.argsort(key, kind="stable")
        p, key = p[by_key], key[by_key]
        order[slots] = p
        first = _runs(key)
        rank[p] = slots[np.flatnonzero(first)][np.cumsum(first) - 1]
        slots = slots[_in_groups(first)]
        h *= 2
    return order


def _runs(values: np.ndarray) -> np.ndarray:
    """True where a run of equal values starts."""
    first = np.ones(len(values), dtype=bool)
    first[1:] = values[1:] != values[:-1]
    return first


def _in_groups(first: np.ndarray) -> np.ndarray:
    """True for the elements of runs longer than one (from the run starts)."""
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, len(first)))
    return np.repeat(lengths > 1, lengths)
