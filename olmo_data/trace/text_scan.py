"""One scan of a run's token files for many texts at once (`olmo-data contamination` without an index): where
each text's k-grams occur, and how far each match goes, as `trace --spans` finds them for one text.

All the texts' k-grams are hashed into one sorted table. Each data position whose next k tokens all occur in some
text (a table lookup and a running sum) is hashed, matched against the table, then confirmed and extended token by
token to the end of their text (`common_prefix`, the index's own comparison, in growing blocks). The matches are
reduced as they are found (`Places`: per start of a text the longest match, how many places hold it, and the first
`keep` of those by file and offset), so memory follows the texts and `keep`, not the number of places, and a span's
places are cut as the index cuts them. A pool of processes reads the texts from a temporary folder, so no task
carries them.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from olmo_data.dataset import InstanceSource
from olmo_data.suffix_index import common_prefix, token_array
from olmo_data.trace.scan import pooled, scan, scanned_files, scanned_tokens
from olmo_data.trace.spans import MAX_PLACES, maximal_spans

_WEIGHTS = np.random.default_rng(0xC0A7).integers(1, 1 << 63, size=4096, dtype=np.uint64) | np.uint64(1)
_BLOCK = 1 << 20  # candidate positions hashed at a time
_GAP = -2  # between two texts in `joined`: no token id equals it
PROBE_TOKENS = 1 << 20  # tokens scanned to estimate a scan's time

# tokens [i, j) of a text; the first `keep` places that hold it over the whole run (by token file, in the run's
# order, then offset: `find_spans`' cut, by the index and by a scan alike), per file; how many hold it in all
SpanPlaces = tuple[int, int, dict[str, np.ndarray], int]


@dataclass
class TextSet:
    """The texts of at least k tokens, joined (each followed by _GAP, which no token equals), and their
    k-grams' hashes sorted, with the start of each in `joined`."""

    ids: list[int]  # which queries
    offsets: np.ndarray  # text m is joined[offsets[m] : offsets[m + 1] - 1]
    joined: np.ndarray
    hashes: np.ndarray
    starts: np.ndarray
    width: int  # the longest text and its end mark: no match goes further

    @classmethod
    def of(cls, queries: Sequence[Sequence[int]], ids: list[int], k: int) -> TextSet:
        texts = [np.asarray(queries[n], dtype=np.int64) for n in ids]
        offsets = np.concatenate([[0], np.cumsum([len(t) + 1 for t in texts])]).astype(np.int64)
        joined = np.concatenate([np.append(t, _GAP) for t in texts])
        starts = np.concatenate([np.arange(a, b - k) for a, b in zip(offsets[:-1], offsets[1:], strict=True)])
        wanted = _hashes(joined, starts, k)
        by_hash = np.argsort(wanted, kind="stable")
        return cls(ids, offsets, joined, wanted[by_hash], starts[by_hash], int(np.diff(offsets).max()))

    def prepared(self) -> _Prepared:
        """What every scan task reads: the arrays, the table of tokens the texts hold, and where each text ends;
        made once per process."""
        present = self.joined[self.joined >= 0]
        table = np.zeros(int(present.max()) + 2, dtype=bool)  # the last entry: every id above the texts' largest
        table[present] = True
        gaps = np.flatnonzero(self.joined < 0)
        ends = np.repeat(gaps, np.diff(np.concatenate([[-1], gaps])))  # per place of `joined`: its text's end
        return _Prepared(self.hashes, self.starts, table, np.asarray(self.joined, dtype=np.int64), ends)


@dataclass
class _Prepared:
    hashes: np.ndarray
    starts: np.ndarray
    table: np.ndarray
    joined: np.ndarray
    ends: np.ndarray


_PREPARED: dict[str, _Prepared] = {}  # per process: the texts a scan's tasks name by key


@contextlib.contextmanager
def _shared(texts: TextSet, pooled: bool) -> Iterator[str]:
    """A key the scan's tasks find the texts by: in this process's cache and, where a pool of processes will
    scan (started by fork or spawn), in a temporary folder its workers map, so that no task carries them."""
    with tempfile.TemporaryDirectory(prefix="olmo-contamination-") as folder:
        _PREPARED[folder] = texts.prepared()
        try:
            if pooled:
                for name in ("joined", "hashes", "starts"):
                    np.save(Path(folder) / f"{name}.npy", getattr(texts, name))
            yield folder
        finally:
            _PREPARED.pop(folder, None)


def _prepared(key: str) -> _Prepared:
    if key not in _PREPARED:  # a worker: map the arrays the driver saved
        arrays = {n: np.load(Path(key) / f"{n}.npy", mmap_mode="r") for n in ("joined", "hashes", "starts")}
        texts = TextSet([], np.zeros(0, dtype=np.int64), np.asarray(arrays["joined"]), arrays["hashes"],
                       arrays["starts"], 0)  # fmt: skip
        _PREPARED[key] = texts.prepared()
    return _PREPARED[key]


class Places:
    """The scan's matches reduced, for a bounded memory whatever the number of places: per start of `joined` that
    some match begins at (`starts`, sorted), the longest match (`best`) and how many places hold it (`count`); and
    of those places at most `keep` a start, the smallest keys (a key is the file's rank in the run's order << 40 |
    the offset), none where best(i) < best(i - 1) (such a start's longest match extends one start earlier whatever
    the rest of the scan finds, so it begins no span; best only grows). A span's places are then listed as the
    index lists them: the first `keep` over the whole run, by file then offset, and counted in all."""

    def __init__(self, *arrays: np.ndarray) -> None:
        starts, best, count, at, length, key = arrays or (_NONE,) * 6
        self.starts: np.ndarray = starts  # per start: the start (in `joined`), its longest match, the places of it
        self.best: np.ndarray = best
        self.count: np.ndarray = count
        self.at: np.ndarray = at  # per place kept: its start, its match's length, its key
        self.length: np.ndarray = length
        self.key: np.ndarray = key

    @classmethod
    def of(cls, start: np.ndarray, length: np.ndarray, key: np.ndarray, keep: int) -> Places:
        """Matches (start, length, key), each a place, as a reduction."""
        return cls.merged([cls(start, length, np.ones(len(start), dtype=np.int64), start, length, key)], keep)

    @classmethod
    def merged(cls, parts: list[Places], keep: int) -> Places:
        """Reductions of the same texts over disjoint places as one."""
        starts, best, count, at, length, key = (np.concatenate([getattr(r, n) for r in parts]) for n in _FIELDS)
        if not len(starts):
            return cls()
        order = np.lexsort((-best, starts))  # by start, the longest first
        starts, best, count = starts[order], best[order], count[order]
        first = np.flatnonzero(np.concatenate([[True], starts[1:] != starts[:-1]]))
        group = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(starts))))
        top = best[first]
        count = np.add.reduceat(np.where(best == top[group], count, 0), first)
        starts, best = starts[first], top
        row = np.searchsorted(starts, at)
        before = np.searchsorted(starts, at - 1)
        held = before < len(starts)
        previous = np.where(held, best[np.minimum(before, len(starts) - 1)], 0)
        previous[held] = np.where(starts[before[held]] == at[held] - 1, previous[held], 0)
        ok = (length == best[row]) & (best[row] >= previous)
        at, length, key = at[ok], length[ok], key[ok]
        order = np.lexsort((key, at))
        at, length, key = at[order], length[order], key[order]
        within = np.arange(len(at)) - np.searchsorted(at, at, side="left")
        ok = within < keep
        return cls(starts, best, count, at[ok], length[ok], key[ok])

    def size(self) -> int:
        return len(self.starts) + len(self.at)

    def with_rank(self, rank: int) -> Places:
        """The same places, their keys (offsets in one file) made keys of the run: the file's rank in front."""
        return Places(self.starts, self.best, self.count, self.at, self.length, self.key + (rank << 40))


_NONE = np.zeros(0, dtype=np.int64)
_FIELDS = ("starts", "best", "count", "at", "length", "key")
_COMPACT = 1 << 22  # places gathered before they are reduced (more, where the reduction itself is larger)


class _Reducing:
    """Reductions gathered and merged whenever they outgrow the last merge (and `_COMPACT`): memory follows the
    reduction's size, never the number of places; the cost of merging stays in proportion to what was added."""

    def __init__(self, keep: int) -> None:
        self.keep, self.done, self.pending, self.size = keep, Places(), list[Places](), 0

    def add(self, part: Places) -> None:
        self.pending.append(part)
        self.size += part.size()
        if self.size > max(_COMPACT, self.done.size()):
            self.result()

    def result(self) -> Places:
        if self.pending:
            self.done, self.pending, self.size = Places.merged([self.done, *self.pending], self.keep), [], 0
        return self.done


def _spans_of(texts: TextSet, places: Places, k: int, paths: list[str]) -> dict[int, list[SpanPlaces]]:
    """{text: its maximal spans, their first places and their count} from the scan's reduction, for the texts that
    have any (what `find_spans` gives for each): the places cut as the index cuts them, the first `keep` over the
    whole run by file in `paths` order (the run's) then offset; a cut per file would name other documents and steps
    than the index does once a span has more than `keep` places."""
    best = np.zeros(len(texts.joined), dtype=np.int64)
    best[places.starts] = places.best
    out: dict[int, list[SpanPlaces]] = {}
    for m in np.unique(np.searchsorted(texts.offsets, places.starts, side="right") - 1).tolist():
        first, length = int(texts.offsets[m]), int(texts.offsets[m + 1] - texts.offsets[m]) - 1
        out[m] = []
        for i, j in maximal_spans(best[first : first + length - k + 1], k):
            g = first + i
            keys = places.key[np.searchsorted(places.at, g, "left") : np.searchsorted(places.at, g, "right")]
            listed = {path: keys[keys >> 40 == r] & ((1 << 40) - 1) for r, path in enumerate(paths)}
            count = int(places.count[np.searchsorted(places.starts, g)])
            out[m].append((i, j, {path: v for path, v in listed.items() if len(v)}, count))
    return out


def estimate_scan(source: InstanceSource, texts: TextSet, k: int, processes: int) -> float:
    """Seconds a scan of every token file would take, from one of `PROBE_TOKENS` tokens."""
    files = scanned_files(source)
    total = scanned_tokens(files)
    path, (dtype, n) = max(files.items(), key=lambda item: item[1][1])
    probe = min(n, PROBE_TOKENS)
    with _shared(texts, pooled=False) as key:
        t0 = time.perf_counter()
        _scan_chunk((path, dtype, 0, probe, key, k, MAX_PLACES))
        seconds = (time.perf_counter() - t0) * total / max(probe, 1)
    return seconds / max(1, processes) if pooled(processes, total) else seconds


def _scan_all(
    source: InstanceSource, texts: TextSet, k: int, keep: int, *, processes: int, progress: bool | None
) -> Places:
    """Every place of the token files that holds a k-gram of a text, extended, as one reduction (`Places`)."""
    files = scanned_files(source)
    rank = {path: r for r, path in enumerate(files)}
    reducing = _Reducing(keep)
    with _shared(texts, pooled=pooled(processes, scanned_tokens(files))) as key:
        for path, found in scan(source, _scan_chunk, (key, k, keep), processes=processes, progress=progress):
            reducing.add(found.with_rank(rank[path]))
    return reducing.result()


def _hashes(tokens: np.ndarray, starts: np.ndarray, k: int) -> np.ndarray:
    """A 64-bit hash of the k tokens from each start (a weighted sum, wrapping), computed a block at a time."""
    out = np.zeros(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, len(starts), _BLOCK):
            at = starts[a : a + _BLOCK]
            acc = np.zeros(len(at), dtype=np.uint64)
            for j in range(k):
                acc += np.asarray(tokens[at + j]).astype(np.uint64) * _WEIGHTS[j % len(_WEIGHTS)]
            out[a : a + _BLOCK] = acc
    return out


def _scan_chunk(task: tuple[str, str, int, int, str, int, int]) -> tuple[str, int, Places]:
    """The places in tokens [lo, hi) of one file that begin a k-gram of a text, as one reduction (keys: offsets in
    the file), `_BLOCK` positions at a time (bounded memory whatever the chunk)."""
    path, dtype, lo, hi, key, k, keep = task
    tokens = token_array(path, dtype)
    texts = _prepared(key)
    reducing = _Reducing(keep)
    for a in range(lo, hi, _BLOCK):
        pos, start, length = _scan_block(tokens, a, min(a + _BLOCK, hi), texts, k).T
        reducing.add(Places.of(start, length, pos, keep))
    return path, hi - lo, reducing.result()


def _scan_block(tokens: np.ndarray, lo: int, hi: int, texts: _Prepared, k: int) -> np.ndarray:
    """Candidates are positions followed by k tokens that all occur in some text (a table lookup and a running
    sum); their k-grams are hashed and matched against the texts', then confirmed and extended token by token:
    to the end of their text."""
    window = np.asarray(tokens[lo : min(hi + k - 1, len(tokens))])
    count = min(hi - lo, len(window) - k + 1)
    empty = np.zeros((0, 3), dtype=np.int64)
    if count <= 0:
        return empty
    table, hashes, starts = texts.table, texts.hashes, texts.starts
    top = len(table) - 1
    inside = table[np.minimum(window.astype(np.int64), top)]
    running = np.concatenate([[0], np.cumsum(inside, dtype=np.int64)])
    candidates = np.flatnonzero(running[k : k + count] - running[:count] == k)
    if not len(candidates):
        return empty
    got = _hashes(window, candidates, k)
    first = np.searchsorted(hashes, got, side="left")
    counts = np.searchsorted(hashes, got, side="right") - first
    keep = counts > 0
    candidates, first, counts = candidates[keep], first[keep], counts[keep]
    if not len(candidates):
        return empty
    pos = np.repeat(candidates + lo, counts)  # a k-gram may begin several places of the texts
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    start = starts[np.repeat(first, counts) + within].astype(np.int64)
    plain = np.asarray(tokens)  # a view of the memory map: what common_prefix indexes fastest
    length, _ = common_prefix(plain, pos, len(plain), texts.joined, start, texts.ends[start] - start)
    ok = length >= k  # the hash matched and so did the tokens
    return np.stack([pos[ok], start[ok], length[ok]], axis=1)


def scan_texts(
    source: InstanceSource,
    texts: TextSet,
    k: int,
    *,
    keep: int = MAX_PLACES,
    processes: int = 1,
    progress: bool | None = None,
) -> dict[int, list[SpanPlaces]]:
    """{text m of `texts`: its maximal spans of at least k tokens, each with its first `keep` positions over the
    run (by token file in the run's order, then offset) and how many hold it}, for the texts found anywhere, from
    one scan of every token file."""
    paths = list(scanned_files(source))
    return _spans_of(texts, _scan_all(source, texts, k, keep, processes=processes, progress=progress), k, paths)
