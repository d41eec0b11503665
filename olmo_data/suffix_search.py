"""Searching a suffix array for pieces of a text, in memory that does not grow with the pieces' length.

A piece is `query[start : start + length]` of one int64 array, so that the many pieces of a span search (every start
of a text, each as long as the rest of it) are never copied into rows. Tokens are compared in blocks that double in
width for the rows still equal, the blocks of all rows together at most BLOCK_ELEMENTS tokens: the cost of a
comparison follows the common prefix it finds, not the piece's length.

The binary search keeps, per row, the common prefix of the piece with the suffixes on either side of its interval
(Manber and Myers' accelerant): every suffix between them shares at least the smaller of the two with the piece, so
each comparison starts there instead of at the first token.
"""

from __future__ import annotations

import numpy as np

PAST_END = -1  # a suffix's token past its window: sorts before every token
QUERY_END = -2  # a piece's token past its end, for a lower bound: the piece sorts before its extensions
QUERY_ABOVE = 1 << 40  # ... for an upper bound: after every suffix it is a prefix of
BLOCK_ELEMENTS = 1 << 20  # tokens compared at once, all rows together (8 MiB an int64 array)
FIRST_BLOCK = 8  # most comparisons of a binary search differ within a few tokens


def common_prefix(
    tokens: np.ndarray,
    pos: np.ndarray,
    limit: np.ndarray | int,
    query: np.ndarray,
    qstart: np.ndarray,
    qlen: np.ndarray,
    *,
    skip: np.ndarray | None = None,
    above: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row r: how many leading tokens the suffix tokens[pos[r] : limit] shares with the piece
    query[qstart[r] : qstart[r] + qlen[r]] (at most qlen[r]), and whether the suffix sorts before the piece (the
    piece followed by QUERY_END, or QUERY_ABOVE with `above`). Rows known to share `skip[r]` tokens start there."""
    rows = len(pos)
    lcp = np.zeros(rows, dtype=np.int64) if skip is None else np.array(skip, dtype=np.int64)
    less = np.zeros(rows, dtype=bool)
    end = np.broadcast_to(np.asarray(limit, dtype=np.int64), (rows,))
    terminator = QUERY_ABOVE if above else QUERY_END
    last_token, last_query = len(tokens) - 1, len(query) - 1
    active = np.arange(rows)
    width = FIRST_BLOCK
    while len(active):
        w = max(1, min(width, BLOCK_ELEMENTS // len(active)))
        offset = lcp[active, None] + np.arange(w)
        at = pos[active, None] + offset
        text = np.asarray(tokens[np.minimum(at, last_token)]).astype(np.int64)
        text[at >= end[active, None]] = PAST_END
        piece = query[np.minimum(qstart[active, None] + offset, last_query)]
        piece[offset >= qlen[active, None]] = terminator
        differ = text != piece
        found = differ.any(axis=1)
        first = np.argmax(differ, axis=1)
        done = active[found]
        lcp[done] += first[found]
        k = np.flatnonzero(found)
        less[done] = text[k, first[k]] < piece[k, first[k]]
        active = active[~found]
        lcp[active] += w
        width *= 2
    return lcp, less


def lower_bound(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    query: np.ndarray,
    qstart: np.ndarray,
    qlen: np.ndarray,
    *,
    above: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per piece: the rank of the first suffix in `suffixes` (positions relative to `base`, each read up to
    `limit`) that does not sort before it; and its common prefix with the suffix ranked just before that and with
    the one at it (0 where there is none). The piece's longest prefix held by these suffixes is the larger two."""
    rows = len(qstart)
    lo, hi = np.zeros(rows, dtype=np.int64), np.full(rows, len(suffixes), dtype=np.int64)
    lcp_lo, lcp_hi = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
    active = np.flatnonzero(lo < hi)
    while len(active):
        mid = (lo[active] + hi[active]) // 2
        pos = base + np.asarray(suffixes[mid]).astype(np.int64)
        skip = np.minimum(lcp_lo[active], lcp_hi[active])
        lcp, less = common_prefix(tokens, pos, limit, query, qstart[active], qlen[active], skip=skip, above=above)
        lo[active] = np.where(less, mid + 1, lo[active])
        lcp_lo[active] = np.where(less, lcp, lcp_lo[active])
        hi[active] = np.where(less, hi[active], mid)
        lcp_hi[active] = np.where(less, lcp_hi[active], lcp)
        active = active[lo[active] < hi[active]]
    return lo, lcp_lo, lcp_hi


def smallest(positions: np.ndarray, lo: int, hi: int, keep: int, block: int = 1 << 22) -> np.ndarray:
    """The `keep` smallest of positions[lo:hi] (a memory map), sorted, reading at most `block` at a time: a piece
    found a million times is counted from its interval, and only the places to list are ever held."""
    best = np.zeros(0, dtype=np.int64)
    if keep <= 0:
        return best
    for a in range(lo, hi, block):
        part = np.concatenate([best, np.asarray(positions[a : min(a + block, hi)]).astype(np.int64)])
        best = np.partition(part, keep - 1)[:keep] if len(part) > keep else part
    return np.sort(best)
