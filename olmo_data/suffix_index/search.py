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
SAMPLE_STEP = 256  # every 256th suffix of a shard is sampled: its keys take 1/8 byte a token (1/4: uint32 tokens)


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
    """Every `step`-th suffix of a sorted shard, keyed by its first WIDTH tokens as big-endian codes packed into
    fixed-width bytes (numpy compares those as memcmp does, so the keys sort as the suffixes do): one
    np.searchsorted of a piece's key replaces the top levels of its binary search. The build writes a shard's keys
    (`of`, `shard-KKKKK.keys`); a query memory-maps them, so a fresh process touches a few pages of them per lookup
    instead of reading thousands of suffixes at random to sample the shard."""

    WIDTH = 8

    def __init__(self, keys: np.ndarray, itemsize: int, count: int, step: int = SAMPLE_STEP) -> None:
        self.code, self.top = key_code(itemsize)
        self.keys, self.count, self.step = keys, count, step

    @classmethod
    def of(cls, tokens: np.ndarray, suffixes: np.ndarray, base: int, limit: int, step: int = SAMPLE_STEP) -> Samples:
        """The samples of a shard's sorted positions `suffixes` (relative to `base`, each suffix read up to
        `limit`)."""
        samples = cls(np.zeros(0, dtype="S1"), tokens.dtype.itemsize, len(suffixes), step)
        pos = base + np.asarray(suffixes[::step]).astype(np.int64)
        at = pos[:, None] + np.arange(cls.WIDTH)
        text = tokens.take(at, mode="clip").astype(np.int64)
        text[at >= limit] = PAST_END
        samples.keys = samples._pack(text)
        return samples

    @classmethod
    def key_bytes(cls, itemsize: int) -> int:
        """Bytes a key takes for tokens of `itemsize` bytes."""
        return cls.WIDTH * key_code(itemsize)[0].itemsize

    def _pack(self, columns: np.ndarray) -> np.ndarray:
        codes = np.where(columns == QUERY_ABOVE, self.top, np.minimum(columns + 2, self.top - 1))  # bigger ids: top-1
        packed = np.ascontiguousarray(codes.astype(self.code))
        return packed.view(f"S{self.WIDTH * self.code.itemsize}").ravel()

    def key_one(self, piece: np.ndarray, above: bool) -> bytes:
        """The key of one piece (the same for every shard of a run's files: computed once a lookup)."""
        head = piece[: self.WIDTH].tolist()
        head += [QUERY_ABOVE if above else QUERY_END] * (self.WIDTH - len(head))
        codes = [self.top if t == QUERY_ABOVE else min(t + 2, self.top - 1) for t in head]
        return np.array(codes, dtype=self.code).tobytes()

    def _ranks(self, below: int, over: int) -> tuple[int, int]:
        lo = (below - 1) * self.step + 1 if below > 0 else 0
        return lo, over * self.step if over < len(self.keys) else self.count

    def bracket_one(self, piece: np.ndarray, above: bool, key: bytes | None = None) -> tuple[int, int]:
        """`bracket` of one piece, in plain Python (`key`: its `key_one`, where already known)."""
        key = self.key_one(piece, above) if key is None else key
        return self._ranks(int(self.keys.searchsorted(key, "left")), int(self.keys.searchsorted(key, "right")))

    def bracket(
        self, query: np.ndarray, qstart: np.ndarray, qlen: np.ndarray, above: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per piece: ranks [lo, hi) that its bound lies in, from the samples whose keys differ from its own."""
        offset = np.arange(self.WIDTH)
        piece = query.take(qstart[:, None] + offset, mode="clip")
        piece[offset >= qlen[:, None]] = QUERY_ABOVE if above else QUERY_END
        keys = self._pack(piece)
        below = np.searchsorted(self.keys, keys, side="left")  # samples [0, below) sort before the piece
        over = np.searchsorted(self.keys, keys, side="right")  # samples [over, ...) after it
        lo = np.where(below > 0, (below - 1) * self.step + 1, 0)
        return lo, np.where(over < len(self.keys), over * self.step, self.count)


def key_code(itemsize: int) -> tuple[np.dtype, int]:
    """The big-endian code a key holds a token in, and its largest value: token + 2 (PAST_END and QUERY_END below
    every token), ids too big for it as top - 1, QUERY_ABOVE as top."""
    if itemsize <= 2:
        return np.dtype(">u4"), (1 << 17) - 1
    return np.dtype(">u8"), (1 << 34) - 1


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
        lo, hi = samples.bracket(query, qstart, qlen, above)
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


Views = tuple[memoryview | None, memoryview | None]  # int_view of a token file, of a shard's positions


def int_view(array: np.ndarray) -> memoryview | None:
    """The array's items as Python ints through a memoryview (a step of a scalar search reads a position and a
    token or two in ~0.1 us each); None where its layout does not allow one. Made once per file and shard."""
    if sys.byteorder != "little" or not array.flags.c_contiguous or array.dtype.kind != "u":
        return None
    if array.dtype.itemsize not in (2, 4) or array.dtype.byteorder == ">":
        return None
    return array.data.cast("B").cast("H" if array.dtype.itemsize == 2 else "I")


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
    views: Views | None = None,
) -> int:
    """`lower_bound` of one piece within ranks [lo, hi), in plain Python over memoryviews: a single lookup (count or
    find of an n-gram, a step of the span walk) pays a few microseconds a step instead of the dozen array
    operations a step of the vectorised search costs whatever its rows."""
    return search_one(tokens, suffixes, base, limit, piece, lo, hi, above, views)[0]


def longest_one(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    piece: np.ndarray,
    lo: int,
    hi: int,
    views: Views | None = None,
) -> int:
    """The longest prefix of one piece that the suffixes hold (`lower_bound`'s larger common prefix), searched
    within the bracket [lo, hi); its edges, never compared by the search, are compared here."""
    rank, lcp_lo, lcp_hi = search_one(tokens, suffixes, base, limit, piece, lo, hi, False, views)
    if rank == lo and rank > 0:
        lcp_lo = _prefix_one(tokens, base + int(suffixes[rank - 1]), limit, piece, 0)[0]
    if rank == hi and rank < len(suffixes):
        lcp_hi = _prefix_one(tokens, base + int(suffixes[rank]), limit, piece, 0)[0]
    return max(lcp_lo, lcp_hi)


def prefix_at(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    piece: np.ndarray,
    rank: int,
    views: Views | None = None,
) -> int:
    """How many leading tokens of the piece the suffix ranked `rank` holds (read up to `limit`): the piece's
    count in a shard is 0 unless its lower bound's suffix holds all of it, which spares that shard's upper bound."""
    view, ranked = views if views is not None else (int_view(tokens), int_view(suffixes))
    p = base + (ranked[rank] if ranked is not None else int(suffixes[rank]))
    if view is not None and len(piece) <= SHORT:
        return _prefix_short(view, p, limit, piece.tolist(), 0, False)[0]
    return _prefix_one(tokens, p, limit, piece, 0)[0]


SHORT = 64  # tokens of a piece compared as Python ints (`_prefix_short`, `_search_short`)


def search_one(
    tokens: np.ndarray,
    suffixes: np.ndarray,
    base: int,
    limit: int,
    piece: np.ndarray,
    lo: int,
    hi: int,
    above: bool,
    views: Views | None = None,
) -> tuple[int, int, int]:
    """The binary search of `bound_one`, with the common prefixes of the piece and the suffixes either side
    (`views`: the int_view of the tokens and of the suffixes, where the caller keeps them)."""
    view, ranked = views if views is not None else (int_view(tokens), int_view(suffixes))
    if view is not None and ranked is not None:
        return _search_short(view, ranked, base, limit, tokens, piece, lo, hi, above)
    lcp_lo = lcp_hi = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        p, skip = base + int(suffixes[mid]), min(lcp_lo, lcp_hi)
        lcp, less = _prefix_one(tokens, p, limit, piece, skip, above)
        if less:
            lo, lcp_lo = mid + 1, lcp
        else:
            hi, lcp_hi = mid, lcp
    return lo, lcp_lo, lcp_hi


def _search_short(
    view: memoryview,
    ranked: memoryview,
    base: int,
    limit: int,
    tokens: np.ndarray,
    piece: np.ndarray,
    lo: int,
    hi: int,
    above: bool,
) -> tuple[int, int, int]:
    """`search_one` over memoryviews, the comparison written into the loop: a step costs ~0.5 us (most differ
    within a token or two of the prefix both sides share), a function call per step would be half as much again.
    Its first SHORT tokens are compared as Python ints; a suffix equal to all of them is compared on with numpy."""
    m = len(piece)
    head = piece[:SHORT].tolist()
    lcp_lo = lcp_hi = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        p = base + ranked[mid]
        j = lcp_lo if lcp_lo < lcp_hi else lcp_hi
        stop = limit - p if limit - p < m else m  # the suffix's window may end inside the piece
        k = stop if stop < SHORT else SHORT
        while j < k and view[p + j] == head[j]:
            j += 1
        if j < k:
            less = view[p + j] < head[j]
        elif k < stop:  # equal through the head: the rest with numpy
            j, less = _prefix_one(tokens, p, limit, piece, j, above)
        else:
            less = stop < m or above  # a window ending inside the piece sorts first; the piece before extensions
        if less:
            lo, lcp_lo = mid + 1, j
        else:
            hi, lcp_hi = mid, j
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
