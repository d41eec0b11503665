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

import sys

import numpy as np

PAST_END = -1  # a suffix's token past its window: sorts before every token
QUERY_END = -2  # a piece's token past its end, for a lower bound: the piece sorts before its extensions
QUERY_ABOVE = 1 << 40  # ... for an upper bound: after every suffix it is a prefix of
BLOCK_ELEMENTS = 1 << 20  # tokens compared at once, all rows together (8 MiB an int64 array)
FIRST_BLOCK = 4  # most comparisons of a binary search differ within a few tokens
SAMPLES = 1 << 14  # suffixes a shard keeps in memory to bracket searches: 512 KB (1 MB for uint32 tokens)


def common_prefix(
    tokens: np.ndarray,
    pos: np.ndarray,
    limit: int,
    query: np.ndarray,
    qstart: np.ndarray,
    qlen: np.ndarray,
    *,
    skip: np.ndarray | None = None,
    above: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row r: how many leading tokens the suffix tokens[pos[r] : limit] (a plain array, not a memory map: its
    indexing is cheaper) shares with the piece
    query[qstart[r] : qstart[r] + qlen[r]] (at most qlen[r]), and whether the suffix sorts before the piece (the
    piece followed by QUERY_END, or QUERY_ABOVE with `above`). Rows known to share `skip[r]` tokens start there."""
    rows = len(pos)
    lcp = np.zeros(rows, dtype=np.int64) if skip is None else np.array(skip, dtype=np.int64)
    less = np.zeros(rows, dtype=bool)
    terminator = QUERY_ABOVE if above else QUERY_END
    active = np.arange(rows)
    width = FIRST_BLOCK
    while len(active):
        w = max(1, min(width, BLOCK_ELEMENTS // len(active)))
        offset = lcp[active, None] + np.arange(w)
        at = pos[active, None] + offset
        text = tokens.take(at, mode="clip").astype(np.int64)
        text[at >= limit] = PAST_END
        piece = query.take(qstart[active, None] + offset, mode="clip")
        piece[offset >= qlen[active, None]] = terminator
        differ = text != piece
        first = np.argmax(differ, axis=1)
        k = np.arange(len(active))
        found = differ[k, first]
        k = k[found]
        done = active[k]
        lcp[done] += first[k]
        less[done] = text[k, first[k]] < piece[k, first[k]]
        active = active[~found]
        lcp[active] += w
        width *= 2
    return lcp, less


class Samples:
    """Every `step`-th suffix of a sorted shard, keyed by its first WIDTH tokens as big-endian bytes (numpy compares
    fixed-width bytes as memcmp does, so the keys sort as the suffixes do): one np.searchsorted of the pieces' keys
    replaces the top levels of every binary search, which otherwise cost a pass over all the rows each."""

    WIDTH = 8

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, base: int, limit: int, count: int = SAMPLES):
        self.code = np.dtype(">u4") if tokens.dtype.itemsize <= 2 else np.dtype(">u8")  # token + 2, and one above
        self.top = (1 << 17) - 1 if tokens.dtype.itemsize <= 2 else (1 << 34) - 1
        step = max(1, len(suffixes) // count)
        self.ranks = np.arange(0, len(suffixes), step, dtype=np.int64)
        pos = base + np.asarray(suffixes[self.ranks]).astype(np.int64)
        at = pos[:, None] + np.arange(self.WIDTH)
        text = tokens.take(at, mode="clip").astype(np.int64)
        text[at >= limit] = PAST_END
        self.keys = self._pack(text)

    def _pack(self, columns: np.ndarray) -> np.ndarray:
        codes = np.where(columns == QUERY_ABOVE, self.top, np.minimum(columns + 2, self.top - 1))  # bigger ids: top-1
        packed = np.ascontiguousarray(codes.astype(self.code))
        return packed.view(f"S{self.WIDTH * self.code.itemsize}").ravel()

    def key_one(self, piece: np.ndarray, above: bool) -> bytes:
        """The key of one piece (the same for every shard of a token file: computed once a lookup)."""
        head = piece[: self.WIDTH].tolist()
        head += [QUERY_ABOVE if above else QUERY_END] * (self.WIDTH - len(head))
        codes = [self.top if t == QUERY_ABOVE else min(t + 2, self.top - 1) for t in head]
        return np.array(codes, dtype=self.code).tobytes()

    def bracket_one(self, piece: np.ndarray, above: bool, count: int, key: bytes | None = None) -> tuple[int, int]:
        """`bracket` of one piece, in plain Python (`key`: its `key_one`, where already known)."""
        key = self.key_one(piece, above) if key is None else key
        below = int(np.searchsorted(self.keys, key, side="left"))
        over = int(np.searchsorted(self.keys, key, side="right"))
        lo = int(self.ranks[below - 1]) + 1 if below > 0 else 0
        return lo, int(self.ranks[over]) if over < len(self.ranks) else count

    def bracket(
        self, query: np.ndarray, qstart: np.ndarray, qlen: np.ndarray, above: bool, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per piece: ranks [lo, hi) that its bound lies in, from the samples whose keys differ from its own."""
        offset = np.arange(self.WIDTH)
        piece = query.take(qstart[:, None] + offset, mode="clip")
        piece[offset >= qlen[:, None]] = QUERY_ABOVE if above else QUERY_END
        keys = self._pack(piece)
        below = np.searchsorted(self.keys, keys, side="left")  # samples [0, below) sort before the piece
        over = np.searchsorted(self.keys, keys, side="right")  # samples [over, ...) after it
        lo = np.where(below > 0, self.ranks[np.maximum(below - 1, 0)] + 1, 0)
        hi = np.where(over < len(self.ranks), self.ranks[np.minimum(over, len(self.ranks) - 1)], count)
        return lo, hi


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
    samples: Samples | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per piece: the rank of the first suffix in `suffixes` (positions relative to `base`, each read up to
    `limit`) that does not sort before it; and its common prefix with the suffix ranked just before that and with
    the one at it (0 where there is none). The piece's longest prefix held by these suffixes is the larger two."""
    rows, count = len(qstart), len(suffixes)
    if samples is not None:
        lo, hi = samples.bracket(query, qstart, qlen, above, count)
    else:
        lo, hi = np.zeros(rows, dtype=np.int64), np.full(rows, count, dtype=np.int64)
    first_lo, first_hi = lo.copy(), hi.copy()
    lcp_lo, lcp_hi = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
    active = np.flatnonzero(lo < hi)
    while len(active):
        mid = (lo[active] + hi[active]) // 2
        pos = base + np.asarray(suffixes[mid]).astype(np.int64)
        skip = np.minimum(lcp_lo[active], lcp_hi[active])  # 0 on a side not compared yet: a safe start
        lcp, less = common_prefix(tokens, pos, limit, query, qstart[active], qlen[active], skip=skip, above=above)
        lo[active] = np.where(less, mid + 1, lo[active])
        lcp_lo[active] = np.where(less, lcp, lcp_lo[active])
        hi[active] = np.where(less, hi[active], mid)
        lcp_hi[active] = np.where(less, lcp_hi[active], lcp)
        active = active[lo[active] < hi[active]]
    for side, first, rank, out in ((-1, first_lo, lo, lcp_lo), (0, first_hi, hi, lcp_hi)):
        # a neighbour the search never compared (the bracket's edge): compare it now
        todo = np.flatnonzero((rank == first) & (rank + side >= 0) & (rank + side < count))
        if len(todo):
            pos = base + np.asarray(suffixes[rank[todo] + side]).astype(np.int64)
            out[todo], _ = common_prefix(tokens, pos, limit, query, qstart[todo], qlen[todo], above=above)
    return lo, lcp_lo, lcp_hi


def bound_one(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    piece: np.ndarray,
    lo: int,
    hi: int,
    *,
    above: bool = False,
) -> int:
    """`lower_bound` of one piece within ranks [lo, hi), in plain Python over slices: a single lookup (count or
    find of an n-gram, a step of the span walk) pays a few microseconds a step instead of the dozen array
    operations a step of the vectorised search costs whatever its rows."""
    return search_one(tokens, suffixes, base, limit, piece, lo, hi, above)[0]


def longest_one(
    tokens: np.ndarray, suffixes: np.ndarray, base: int, limit: int, piece: np.ndarray, lo: int, hi: int
) -> int:
    """The longest prefix of one piece that the suffixes hold (`lower_bound`'s larger common prefix), searched
    within the bracket [lo, hi); its edges, never compared by the search, are compared here."""
    rank, lcp_lo, lcp_hi = search_one(tokens, suffixes, base, limit, piece, lo, hi, False)
    if rank == lo and rank > 0:
        lcp_lo = _prefix_one(tokens, base + int(suffixes[rank - 1]), limit, piece, 0)[0]
    if rank == hi and rank < len(suffixes):
        lcp_hi = _prefix_one(tokens, base + int(suffixes[rank]), limit, piece, 0)[0]
    return max(lcp_lo, lcp_hi)


SHORT = 64  # pieces up to this many tokens are compared as Python ints (`_prefix_short`)


def search_one(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    piece: np.ndarray,
    lo: int,
    hi: int,
    above: bool,
) -> tuple[int, int, int]:
    """The binary search of `bound_one`, with the common prefixes of the piece and the suffixes either side."""
    lcp_lo = lcp_hi = 0
    fits = len(piece) <= SHORT and sys.byteorder == "little" and tokens.flags.c_contiguous
    short = piece.tolist() if fits and tokens.dtype.itemsize in (2, 4) else None
    # both as memoryviews, whose items are Python ints: a step reads a position and a token or two in ~0.1 us each
    view = tokens.data.cast("B").cast("H" if tokens.dtype.itemsize == 2 else "I") if short else None
    ranked = suffixes.data.cast("B").cast("I") if short and suffixes.flags.c_contiguous else None
    while lo < hi:
        mid = (lo + hi) >> 1
        p, skip = base + (ranked[mid] if ranked is not None else int(suffixes[mid])), min(lcp_lo, lcp_hi)
        if short is not None and view is not None:
            lcp, less = _prefix_short(view, p, limit, short, skip, above)
        else:
            lcp, less = _prefix_one(tokens, p, limit, piece, skip, above)
        if less:
            lo, lcp_lo = mid + 1, lcp
        else:
            hi, lcp_hi = mid, lcp
    return lo, lcp_lo, lcp_hi


def _prefix_short(tokens: memoryview, p: int, limit: int, piece: list[int], skip: int, above: bool) -> tuple[int, bool]:
    """`_prefix_one` of a short piece over the tokens as a memoryview (its items are Python ints): most steps of a
    search differ within a token or two of `skip`, which this reads one at a time for a fraction of what a slice
    and array operations cost."""
    m = len(piece)
    end = min(p + m, limit)
    for j in range(skip, end - p):
        t = tokens[p + j]
        if t != piece[j]:
            return j, t < piece[j]
    if end - p < m:  # the suffix's window ends inside the piece: it sorts first
        return end - p, True
    return m, above  # the piece is a prefix of the suffix


def _prefix_one(
    tokens: np.ndarray, p: int, limit: int, piece: np.ndarray, skip: int, above: bool = False
) -> tuple[int, bool]:
    """The common prefix of the suffix at p (read up to `limit`) and the piece, known to share `skip` tokens, and
    whether the suffix sorts before the piece."""
    m = len(piece)
    end = min(p + m, limit)
    text = tokens[p + skip : end]
    differ = text != piece[skip : skip + len(text)]
    j = int(differ.argmax()) if len(differ) else 0
    if len(differ) and differ[j]:
        return skip + j, bool(text[j] < piece[skip + j])
    if end - p < m:  # the suffix's window ends inside the piece: it sorts first
        return end - p, True
    return m, above  # the piece is a prefix of the suffix


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
