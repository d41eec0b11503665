"""L(i), the longest prefix of text[i:] that the token files hold, for every start i of a text, and the places of
the maximal spans it gives: with the suffix index or by a scan, in time and memory about linear in the text.

Both rest on one fact: a match of length l at start i is a match of length l - 1 at start i + 1, so
L(i + 1) >= L(i) - 1.

With the index, the starts are searched to CAP tokens in batches from the left (one binary search a shard for a
whole batch, comparisons that stop at the first differing token; with min_tokens k, every (k // 2)-th start first,
and only the starts near one that may hold k tokens after it). Starts held to the cap are walked in order: L(i) from
one search of the rest of the text; every start up to i + L(i) holds at least the rest of that match, and only
where some start holds one token more (found by galloping back from the match's end, monotone in the start) is L
searched again. The starts
searched deeply are about one per maximal match, so a text held in the data as a whole costs a few searches, not
one per token as long as the rest of the text.

The scan keeps only left-maximal matches (the text and the file differ just before them, or either starts there):
a match that is not is one token shorter than a match one start earlier, so L(i) = max(M(i), L(i - 1) - 1) with M
over left-maximal matches, and every place of a maximal span is left-maximal. A file chunk's matches are reduced
as they are found to, per start, the longest length, how many places have it, and the first `keep` of those, so
memory follows the text's length times `keep`, never the number of places.
"""

from __future__ import annotations

import numpy as np

from olmo_data.dataset import InstanceSource
from olmo_data.display import progress_bar
from olmo_data.suffix_index import RunIndex, common_prefix, token_array
from olmo_data.trace.scan import PROGRESS_DELAY, scan, scanned_files, scanned_tokens

CAP = 64  # tokens every start is searched to before the walk
BATCH = 1 << 14  # starts searched at once, at most
FIRST_BATCH = 256  # ... at first, and after a long match (x4 each batch)
PAIRS = 1 << 20  # (place, start) pairs of a scan compared at once
_WEIGHTS = np.random.default_rng(0x5EA4).integers(1, 1 << 63, size=4096, dtype=np.uint64) | np.uint64(1)


# -- with the index -----------------------------------------------------------------------------------------------


def index_longest(index: RunIndex, query: np.ndarray, progress: bool | None = None, min_tokens: int = 1) -> np.ndarray:
    """L(i) for every start of `query`, from the suffix index, exact where at least `min_tokens` (elsewhere below
    it), settled from the left: the next starts are searched to CAP tokens in a batch (that grows while nothing
    long is found, so a text the data holds whole costs one small batch), and a start held to the cap is walked
    (`_walk`). With `min_tokens` k, a batch first searches every h-th start (h = k // 2): a start of L >= k is
    followed within h starts by one of L >= k - h + 1, so only the starts before such a one are searched."""
    n = len(query)
    longest = np.full(n, -1, dtype=np.int64)  # -1: not searched; -2: below min_tokens; min(L, CAP); L once settled
    step = max(1, min(min_tokens, CAP) // 2)
    settled, batch = 0, FIRST_BATCH
    with progress_bar(desc="spans", total=n, unit=" tokens", progress=progress, delay=PROGRESS_DELAY) as bar:
        while settled < n:
            if longest[settled] == -1:
                _screened(index, query, longest, settled, min(n, settled + batch), step, min_tokens)
                batch = min(4 * batch, BATCH)
            ahead = longest[settled:]
            deep = (ahead == CAP) & (n - np.arange(settled, n) > CAP)  # held to the cap, and the text goes on
            stop = np.flatnonzero((ahead == -1) | deep)
            following = settled + (int(stop[0]) if len(stop) else len(ahead))  # the starts before are settled
            if following < n and longest[following] != -1:
                following = _walk(index, query, longest, following, min_tokens)
                batch = FIRST_BATCH
            bar.update(following - settled)
            settled = following
    longest[longest < 0] = 0
    return longest


def _screened(
    index: RunIndex, query: np.ndarray, longest: np.ndarray, a: int, b: int, step: int, min_tokens: int
) -> None:
    """min(L, CAP) for the starts in [a, b) that may hold min_tokens; -2 for the others (see index_longest)."""
    if step == 1:
        _capped(index, query, longest, a, b)
        return
    n = len(query)
    first = -(-a // step) * step
    samples = np.arange(first, min(n, b + step), step)  # the sample after b too: it screens the starts before it
    _capped(index, query, longest, samples=samples)
    good = samples[longest[samples] >= min_tokens - step + 1]
    rows = (good[:, None] - np.arange(step)).ravel()
    rows = rows[(rows >= a) & (rows < b)]
    _capped(index, query, longest, samples=np.unique(rows))
    part = longest[a:b]
    part[part == -1] = -2


def _capped(
    index: RunIndex,
    query: np.ndarray,
    longest: np.ndarray,
    a: int = 0,
    b: int = 0,
    samples: np.ndarray | None = None,
) -> None:
    """min(L, CAP) for the starts in [a, b) (or `samples`) not searched yet."""
    rows = a + np.flatnonzero(longest[a:b] == -1) if samples is None else samples[longest[samples] == -1]
    if len(rows):
        longest[rows] = index.longest(query, rows, np.minimum(CAP, len(query) - rows))


def _walk(index: RunIndex, query: np.ndarray, longest: np.ndarray, i: int, min_tokens: int) -> int:
    """From start i, held to the cap: L of i and of the starts after it that follow from it, written into
    `longest`; returns the first start not settled."""
    n = len(query)
    while True:
        length = int(index.longest(query, np.array([i]))[0])
        longest[i] = length
        end = i + length
        if end >= n:  # held to the text's end: so is every later start
            longest[i + 1 :] = n - np.arange(i + 1, n)
            return n
        nxt = _first_held(index, query, longest, i, end + 1, min_tokens)
        longest[i + 1 : nxt] = end - np.arange(i + 1, nxt)  # they hold the rest of i's match, not one token more
        if nxt == n:
            return n
        _capped(index, query, longest, nxt, nxt + 1)
        if longest[nxt] < CAP or n - nxt <= CAP:  # the capped search settled it
            return nxt
        i = nxt


def _first_held(index: RunIndex, query: np.ndarray, longest: np.ndarray, bad: int, end: int, min_tokens: int) -> int:
    """The first start in (bad, end) that holds query[start : end] (`bad`'s does not; holding is monotone in the
    start), or `end`: probed from the right at doubling distances, then halved, each probe answered by what
    `longest` already knows or by one search of the piece."""

    def held(start: int) -> bool:
        known, length = int(longest[start]), end - start
        if known >= 0 and (known < CAP or length <= CAP):
            return known >= length
        if known == -2 and length >= min_tokens:
            return False
        return int(index.longest(query, np.array([start]), np.array([length]))[0]) == length

    good, step = end, 1
    while end - step > bad:
        probe = end - step
        if not held(probe):
            bad = probe
            break
        good, step = probe, step * 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if held(mid):
            good = mid
        else:
            bad = mid
    return good


def index_places(
    index: RunIndex, query: np.ndarray, spans: list[tuple[int, int]], keep: int
) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """Per span: how many places hold it, and the first `keep` of them per token file."""
    if not spans:
        return [], []
    starts = np.array([i for i, _ in spans], dtype=np.int64)
    lengths = np.array([j - i for i, j in spans], dtype=np.int64)
    counts, listed = [], []
    for a in range(0, len(spans), BATCH):
        c, places = index.occurrences(query, starts[a : a + BATCH], lengths[a : a + BATCH], keep)
        counts.extend(c.tolist())
        listed.extend(places)
    return counts, listed


# -- by a scan ----------------------------------------------------------------------------------------------------


def scan_longest(
    source: InstanceSource,
    query: np.ndarray,
    min_tokens: int,
    keep: int,
    *,
    processes: int = 1,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, ScanPlaces, int]:
    """L(i) for every start (exact where at least `min_tokens`); per start, how many places hold its longest
    match and the first `keep` of them per token file (only where that start may begin a maximal span); and the
    tokens scanned."""
    files = scanned_files(source)
    paths = list(files)
    rank = {p: k for k, p in enumerate(paths)}
    total = scanned_tokens(files)
    n = len(query)
    state = _empty(n)
    for path, found in scan(source, _scan_chunk, (query, min_tokens, keep), processes=processes, progress=progress):
        best, count, start, pos = found
        key = (rank[path] << 40) + pos  # places ordered by file, in the run's order, then position
        state = _merge(state, (best, count, start, key), keep)
    best, count, start, key = state
    longest = np.maximum.accumulate(best + np.arange(n)) - np.arange(n)  # L(i) = max(M(i), L(i - 1) - 1)
    return longest, count, ScanPlaces(paths, start, key), total


class ScanPlaces:
    """The places a scan kept, per start: (start, key) rows sorted by start, a key being file rank << 40 | position."""

    def __init__(self, paths: list[str], start: np.ndarray, key: np.ndarray) -> None:
        self.paths, self.start, self.key = paths, start, key

    def of(self, i: int) -> dict[str, np.ndarray]:
        rows = self.key[np.searchsorted(self.start, i, "left") : np.searchsorted(self.start, i, "right")]
        return {p: rows[rows >> 40 == k] & ((1 << 40) - 1) for k, p in enumerate(self.paths)}


State = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # best, count (per start); start, key (per place)


def _empty(n: int) -> State:
    return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, np.int64)


def _merge(a: State, b: State, keep: int) -> State:
    """Two reductions of the same starts as one: per start the longer best (counts added where equal), the places
    of the best, at most `keep` a start (the smallest keys), none where the start cannot begin a maximal span."""
    best = np.maximum(a[0], b[0])
    count = np.where(a[0] == best, a[1], 0) + np.where(b[0] == best, b[1], 0)
    start = np.concatenate([a[2][a[0][a[2]] == best[a[2]]], b[2][b[0][b[2]] == best[b[2]]]])
    key = np.concatenate([a[3][a[0][a[2]] == best[a[2]]], b[3][b[0][b[2]] == best[b[2]]]])
    return best, count, *_trim(best, start, key, keep)


def _trim(best: np.ndarray, start: np.ndarray, key: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `keep` places a start, the smallest; and none where best(i) < best(i - 1): such a start's longest
    match extends one start earlier whatever the rest of the scan finds (best only grows), so it begins no span."""
    previous = np.concatenate([[0], best[:-1]])
    ok = best[start] >= previous[start]
    start, key = start[ok], key[ok]
    order = np.lexsort((key, start))
    start, key = start[order], key[order]
    first = np.searchsorted(start, start, side="left")
    within = np.arange(len(start)) - first
    return start[within < keep], key[within < keep]


def _scan_chunk(task: tuple[str, str, int, int, np.ndarray, int, int]) -> tuple[str, int, State]:
    """The left-maximal matches of at least k tokens that begin in tokens [lo, hi) of one file, reduced per start
    of the query (see `_merge`).

    Candidates are positions followed by k tokens that all occur in the query (a table lookup and a running sum);
    their k-grams are hashed and matched against the query's, paired with every start of the query of that hash,
    kept where left-maximal, and measured token by token (which also drops a hash's false match)."""
    path, dtype, lo, hi, query, k, keep = task
    n = len(query)
    state = _empty(n)
    tokens = np.asarray(token_array(path, dtype))  # a plain view of the memory map: cheaper to index
    window = np.asarray(tokens[lo : min(hi + k - 1, len(tokens))])
    count = min(hi - lo, len(window) - k + 1)
    if count <= 0:
        return path, hi - lo, state
    top = int(query.max()) + 1
    table = np.zeros(top + 1, dtype=bool)
    table[query] = True
    inside = table[np.minimum(window.astype(np.int64), top)]  # in int64: top may exceed the dtype (65535 + 1)
    running = np.concatenate([[0], np.cumsum(inside, dtype=np.int64)])
    candidates = np.flatnonzero(running[k : k + count] - running[:count] == k)
    if not len(candidates):
        return path, hi - lo, state
    wanted = _hashes(query, np.arange(n - k + 1), k)
    got = _hashes(window, candidates, k)
    keep_it = np.isin(got, wanted)
    candidates, got = candidates[keep_it], got[keep_it]
    by_hash = np.argsort(wanted, kind="stable")  # a k-gram may occur at several starts of the query
    first = np.searchsorted(wanted[by_hash], got, side="left")
    counts = np.searchsorted(wanted[by_hash], got, side="right") - first
    ends = np.cumsum(counts)
    a = 0
    while a < len(candidates):  # in batches of about PAIRS pairs: a k-gram may be very common in both
        b = max(a + 1, int(np.searchsorted(ends, (ends[a - 1] if a else 0) + PAIRS, side="right")))
        c = counts[a:b]
        pos = np.repeat(candidates[a:b] + lo, c)
        within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        start = by_hash[np.repeat(first[a:b], c) + within].astype(np.int64)
        left = (start == 0) | (pos == 0)
        left[~left] = np.asarray(tokens[pos[~left] - 1]).astype(np.int64) != query[start[~left] - 1]
        pos, start = pos[left], start[left]
        length, _ = common_prefix(tokens, pos, len(tokens), query, start, n - start)
        ok = length >= k  # the hash matched and so did the tokens
        state = _merge(state, _reduce(n, start[ok], length[ok], pos[ok], keep), keep)
        a = b
    return path, hi - lo, state


def _reduce(n: int, start: np.ndarray, length: np.ndarray, key: np.ndarray, keep: int) -> State:
    """Matches (start, length, place) as a reduction: per start the longest, how many places, which."""
    best = np.zeros(n, dtype=np.int64)
    np.maximum.at(best, start, length)
    top = length == best[start]
    count = np.bincount(start[top], minlength=n).astype(np.int64)
    return best, count, *_trim(best, start[top], key[top], keep)


def _hashes(tokens: np.ndarray, at: np.ndarray, k: int) -> np.ndarray:
    """A 64-bit hash of the k tokens from each position of `at`, one token column at a time (no k-wide copy)."""
    out = np.zeros(len(at), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            out += np.asarray(tokens[at + j]).astype(np.uint64) * _WEIGHTS[j % len(_WEIGHTS)]
    return out
