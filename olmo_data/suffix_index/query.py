"""Queries of a run's suffix index: counts, places and longest matches of token sequences over every shard of
every token file (`open_index` checks each index is complete and current first). Built by `index`.

A single lookup (count or find of an n-gram, a step of a span walk) costs ~10-20 us a shard: its keys are
computed once for the run, each shard's bracket is one np.searchsorted of its memory-mapped sampled keys, and the
binary search inside it reads tokens and positions as Python ints through memoryviews made once; a shard whose
lower bound does not hold the sequence skips the upper bound. Many pieces at once (a long text's starts) go through
the vectorised search in `search`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset import InstanceSource
from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote
from olmo_data.suffix_index.integrity import sampled_check
from olmo_data.suffix_index.layout import (
    INDEX_VERSION,
    file_stamp,
    index_folder,
    random_access,
    read_json_capped,
    read_manifest,
    shard_file,
    stamp_change,
    token_array,
    will_read,
)
from olmo_data.suffix_index.parts import refuse_unfinished
from olmo_data.suffix_index.search import (
    QUERY_ABOVE,
    SAMPLE_STEP,
    Samples,
    Views,
    bound_one,
    common_prefix,
    int_view,
    longest_one,
    lower_bound,
    prefix_at,
    smallest,
)

ROWS = 1 << 16  # pieces searched at once: their bookkeeping stays a few MB
FEW_ROWS = 16  # up to this many pieces, one at a time in plain Python costs less than the vectorised search


@dataclass
class Shard:
    start: int
    end: int
    window_end: int
    positions: np.ndarray  # uint32 memory map, relative to start
    samples: Samples  # its sampled keys (a memory map)
    views: Views = field(default=(None, None))  # int_view of the file's tokens and of the positions


class FileSuffixIndex:
    """The shards of one token file's index, and its tokens (a memory map). Pieces of a query are searched as
    (start, length) rows of one array (suffix_search), so that no row is ever copied out to the query's length."""

    def __init__(self, path: str, dtype: str, folder: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.tokens = random_access(token_array(path, dtype))
        self.view = int_view(self.tokens)
        self.shards: list[Shard] = []
        self.folder = folder
        n, itemsize = len(self.tokens), self.tokens.dtype.itemsize
        rng = np.random.default_rng()  # fresh draws each query: damage one query misses, a later one finds
        for k in range(int(manifest["shards"])):
            data, keys = shard_file(folder, k, "u32"), shard_file(folder, k, "keys")
            record = _shard_record(shard_file(folder, k, "json"))
            start, end, window_end = _shard_range(record)
            previous = self.shards[-1].end if self.shards else 0
            if start != previous or not start < end <= window_end <= n:
                raise _not_covering(folder, path, n)
            count = end - start
            _check_size(data, 4 * count)
            _check_size(keys, -(-count // SAMPLE_STEP) * Samples.key_bytes(itemsize))
            positions = random_access(np.memmap(data, dtype="<u4", mode="r"))
            width = Samples.key_bytes(itemsize)
            key_map = random_access(np.memmap(keys, dtype=f"S{width}", mode="r"))
            sampled_check(self.tokens, folder, k, (start, end, window_end), positions, key_map, record, path, rng)
            samples = Samples(key_map, itemsize, count)
            self.shards.append(Shard(start, end, window_end, positions, samples, (self.view, int_view(positions))))
        if (self.shards[-1].end if self.shards else 0) != n:
            raise _not_covering(folder, path, n)
        self.keys_of = self.shards[0].samples.key_one if self.shards else None

    def _near_end(self, shard: Shard, length: int) -> np.ndarray:
        """Positions of the shard whose window is too short to hold `length` tokens although the file goes on:
        these are checked against the file itself."""
        if shard.window_end >= len(self.tokens) or length <= shard.window_end - shard.end:
            return np.zeros(0, dtype=np.int64)
        return np.arange(max(shard.start, shard.window_end - length + 1), shard.end, dtype=np.int64)

    def _near_prefixes(
        self, near: np.ndarray, query: np.ndarray, starts: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray:
        """The common prefix of each piece (row) with the file at each position of `near` (column), read to the
        file's end; in column blocks so that rows x columns stays small."""
        out = np.zeros((len(starts), len(near)), dtype=np.int64)
        step = max(1, ROWS // max(len(starts), 1))
        for a in range(0, len(near), step):
            pos = near[a : a + step]
            pairs_pos = np.tile(pos, len(starts))
            pairs_row = np.repeat(np.arange(len(starts)), len(pos))
            lcp, _ = common_prefix(
                self.tokens, pairs_pos, len(self.tokens), query, starts[pairs_row], lengths[pairs_row]
            )
            out[:, a : a + step] = lcp.reshape(len(starts), len(pos))
        return out

    def longest(self, query: np.ndarray, starts: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
        """For each start i: the length of the longest prefix of query[i:] that the file holds, at most `caps`
        (default: the rest of the query). The longest match sorts right before or after the piece, so one binary
        search a shard answers it."""
        starts = np.asarray(starts, dtype=np.int64)
        caps = len(query) - starts if caps is None else np.asarray(caps, dtype=np.int64)
        best = np.zeros(len(starts), dtype=np.int64)
        if not len(starts):
            return best
        few = len(starts) <= FEW_ROWS  # the steps of a span walk: a scalar search each
        pieces = [query[int(a) : int(a + c)] for a, c in zip(starts, caps, strict=True)] if few else []
        keys = [self.keys_of(piece, False) for piece in pieces] if self.keys_of is not None else []
        for shard in self.shards:
            for r, (piece, key) in enumerate(zip(pieces, keys, strict=True)):
                edges = shard.samples.bracket_one(piece, False, key)
                args = (self.tokens, shard.positions, shard.start, shard.window_end, piece)
                best[r] = max(int(best[r]), longest_one(*args, *edges, shard.views))
            for a in range(0, 0 if few else len(starts), ROWS):
                rows = slice(a, a + ROWS)
                _, before, at = lower_bound(
                    self.tokens,
                    shard.positions,
                    shard.start,
                    shard.window_end,
                    query,
                    starts[rows],
                    caps[rows],
                    samples=shard.samples,
                )
                best[rows] = np.maximum(best[rows], np.maximum(before, at))
            near = self._near_end(shard, int(caps.max()))
            long = np.flatnonzero(caps > shard.window_end - shard.end)  # the pieces some window is too short for
            if len(near) and len(long):
                got = self._near_prefixes(near, query, starts[long], caps[long]).max(axis=1)
                best[long] = np.maximum(best[long], got)
        return best

    def occurrences(
        self, query: np.ndarray, starts: np.ndarray, lengths: np.ndarray, keep: np.ndarray
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """For each piece query[start : start + length]: how many positions of the file hold it, and the `keep`
        smallest of them (sorted). Counted from each shard's interval of the suffix array, which is read only as
        far as the places to keep."""
        starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        counts = np.zeros(len(starts), dtype=np.int64)
        listed: list[list[np.ndarray]] = [[] for _ in range(len(starts))]
        quota = np.array(keep, dtype=np.int64)
        if not len(starts):
            return counts, []
        for shard in self.shards:
            args = (self.tokens, shard.positions, shard.start, shard.window_end, query, starts, lengths)
            lo, _, _ = lower_bound(*args, samples=shard.samples)
            hi, _, _ = lower_bound(*args, above=True, samples=shard.samples)
            counts += hi - lo
            near = self._near_end(shard, int(lengths.max()))
            long_rows = np.flatnonzero(lengths > shard.window_end - shard.end)
            held: dict[int, np.ndarray] = {}
            if len(near) and len(long_rows):  # positions whose window holds the piece only in part
                prefixes = self._near_prefixes(near, query, starts[long_rows], lengths[long_rows])
                for k, r in enumerate(long_rows.tolist()):
                    beyond = near + lengths[r] > shard.window_end  # the others' windows hold it: in the interval
                    held[r] = near[(prefixes[k] >= lengths[r]) & beyond]
                    counts[r] += len(held[r])
            small = (hi > lo) & (hi - lo <= quota)  # listed whole: read together, sorted per row
            small[list(held)] = False
            rows = np.flatnonzero(small)
            sizes = (hi - lo)[rows]
            at = np.repeat(lo[rows] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
            values = shard.start + shard.positions[at].astype(np.int64)
            values = values[np.lexsort((values, np.repeat(rows, sizes)))]
            pieces = np.split(values, np.cumsum(sizes)[:-1]) if len(rows) else []
            for r, here in zip(rows.tolist(), pieces, strict=True):
                listed[r].append(here)
            quota[rows] -= sizes
            others = set(np.flatnonzero((hi > lo) & ~small).tolist()) | {r for r, h in held.items() if len(h)}
            for r in sorted(others):
                will_read(shard.positions, int(lo[r]), int(hi[r]))
                here = shard.start + smallest(shard.positions, int(lo[r]), int(hi[r]), int(quota[r]))
                if r in held:  # never in the interval: a window too short to hold the piece sorts it elsewhere
                    here = np.sort(np.concatenate([here, held[r]]))[: quota[r]]
                listed[r].append(here)
                quota[r] -= len(here)
        return counts, [np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in listed]

    def intervals(
        self, sequence: np.ndarray, keys: tuple[bytes, bytes] | None = None
    ) -> list[tuple[Shard, int, int, np.ndarray]]:
        """Per shard: the ranks [lo, hi) of the suffixes that start with `sequence`, and the positions near its end
        that hold it although its window is too short to (checked against the file). `keys`: the sequence's
        sample keys (lower, upper), where the run's other files computed them already."""
        m, out = len(sequence), []
        if keys is None and self.keys_of is not None:
            keys = (self.keys_of(sequence, False), self.keys_of(sequence, True))
        for shard in self.shards:
            assert keys is not None
            args = (self.tokens, shard.positions, shard.start, shard.window_end, sequence)
            edge_lo, edge_hi = shard.samples.bracket_one(sequence, False, keys[0])
            lo = hi = bound_one(*args, edge_lo, edge_hi, views=shard.views)
            if lo < len(shard.positions) and prefix_at(*args, lo, shard.views) == m:  # else none here: hi = lo
                top_lo, top_hi = shard.samples.bracket_one(sequence, True, keys[1])
                hi = bound_one(*args, max(lo + 1, top_lo), top_hi, above=True, views=shard.views)
            near = self._near_end(shard, m)
            if len(near):
                near = near[near + m > shard.window_end]
                zero = np.zeros(1, dtype=np.int64)
                near = near[self._near_prefixes(near, sequence, zero, zero + m)[0] >= m] if len(near) else near
            out.append((shard, lo, hi, near))
        return out

    def count(self, sequence: np.ndarray, keys: tuple[bytes, bytes] | None = None) -> int:
        """How many positions of the file hold `sequence`."""
        if not len(sequence):
            return 0
        return sum(hi - lo + len(near) for _, lo, hi, near in self.intervals(sequence, keys))

    def find(self, sequence: np.ndarray, keys: tuple[bytes, bytes] | None = None) -> np.ndarray:
        """Every position where the file holds `sequence`, sorted."""
        if not len(sequence):
            return np.zeros(0, dtype=np.int64)
        found = []
        for shard, lo, hi, near in self.intervals(sequence, keys):
            will_read(shard.positions, lo, hi)
            found.append(np.concatenate([shard.start + shard.positions[lo:hi].astype(np.int64), near]))
        return np.sort(np.concatenate(found))


def _shard_record(path: Path) -> dict[str, Any]:
    """A shard's record; {} where it is missing or damaged (the shards then do not cover the file, which is said
    as such); one line naming it where it is too large to be one."""
    try:
        meta = read_json_capped(path)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _shard_range(meta: dict[str, Any]) -> tuple[int, int, int]:
    """A shard record's start, end and window end; (-1, -1, -1) where they are missing or damaged."""
    try:
        return int(meta["start"]), int(meta["end"]), int(meta["window_end"])
    except (ValueError, TypeError, KeyError):
        return -1, -1, -1


def _check_size(path: Path, want: int) -> None:
    """A shard's positions or keys of the size its range asks for, or one line naming the file."""
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size != want:
        found = "missing" if size < 0 else f"{size:,} bytes"
        raise DataError(
            f"{path}: {found}, expected {want:,} bytes for its shard's range; rerun `olmo-data index CONFIG` (it "
            "rebuilds that shard), or trace with --no-index"
        )


def _not_covering(folder: Path, path: str, n: int) -> DataError:
    return DataError(
        f"{folder}: the suffix index's shards do not cover the {n} tokens of {path} exactly (a rebuild cut "
        "short?); rerun `olmo-data index CONFIG`, or trace with --no-index"
    )


class RunIndex:
    """The indexes of every distinct token file of a run, checked fresh."""

    def __init__(self, files: dict[str, FileSuffixIndex], tokens: int, empty: Sequence[str] = ()) -> None:
        self.files = files
        self.tokens = tokens
        self.empty = list(empty)  # token files of no tokens: never indexed, never a match

    def _keys(self, seq: np.ndarray) -> dict[int, tuple[bytes, bytes]]:
        """The sequence's sample keys for each token width of the run's files (computed once a lookup)."""
        out: dict[int, tuple[bytes, bytes]] = {}
        for index in self.files.values():
            width = index.tokens.dtype.itemsize
            if width not in out and index.keys_of is not None and len(seq):
                out[width] = (index.keys_of(seq, False), index.keys_of(seq, True))
        return out

    def find(self, sequence: Sequence[int]) -> dict[str, np.ndarray]:
        seq = _never_past_end(sequence)
        keys = self._keys(seq)
        out = {path: np.zeros(0, dtype=np.int64) for path in self.empty}
        return out | {path: i.find(seq, keys.get(i.tokens.dtype.itemsize)) for path, i in self.files.items()}

    def count(self, sequence: Sequence[int]) -> int:
        """How many places of the token files hold `sequence` (infini-gram's count), without listing them."""
        seq = _never_past_end(sequence)
        keys = self._keys(seq)
        return sum(i.count(seq, keys.get(i.tokens.dtype.itemsize)) for i in self.files.values())

    def longest(
        self, query: Sequence[int] | np.ndarray, starts: np.ndarray, caps: np.ndarray | None = None
    ) -> np.ndarray:
        """For each start i: the longest prefix of query[i:] (at most `caps`) that some token file holds."""
        q = _never_past_end(query)
        best = np.zeros(len(starts), dtype=np.int64)
        for index in self.files.values():
            best = np.maximum(best, index.longest(q, starts, caps))
        return best

    def occurrences(
        self, query: Sequence[int] | np.ndarray, starts: np.ndarray, lengths: np.ndarray, keep: int
    ) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
        """For each piece query[start : start + length]: how many places of the token files hold it, and the first
        `keep` of them (by file, in the run's order, then position), per file."""
        q = _never_past_end(query)
        counts = np.zeros(len(starts), dtype=np.int64)
        quota = np.full(len(starts), keep, dtype=np.int64)
        listed: list[dict[str, np.ndarray]] = [
            {path: np.zeros(0, dtype=np.int64) for path in self.empty} for _ in starts
        ]
        for path, index in self.files.items():
            found, places = index.occurrences(q, starts, lengths, quota)
            counts += found
            for r, at in enumerate(places):
                listed[r][path] = at
                quota[r] -= len(at)
        return counts, listed


def _never_past_end(query: Sequence[int] | np.ndarray) -> np.ndarray:
    """The query as int64, a negative id (which no token file holds) made one that sorts after every suffix, so
    that it cannot equal the PAST_END marker and match where a scan would not."""
    q = np.asarray(query, dtype=np.int64)
    return np.where(q < 0, QUERY_ABOVE << 1, q)


def open_index(source: InstanceSource, index_dir: str | None = None) -> RunIndex | None:
    """The run's index when every token file has one; None when none has. A partial or stale index is refused:
    its answers would differ from the scan's without saying so."""
    files = {f.path: f for f in source.files}
    found: dict[str, FileSuffixIndex] = {}
    missing = []
    empty = [path for path, f in files.items() if f.num_tokens == 0]
    for path, f in files.items():
        if f.num_tokens == 0:
            continue
        folder = index_folder(path, index_dir)
        manifest = None if is_remote(path) else read_manifest(folder)
        if manifest is None and not is_remote(path):
            refuse_unfinished(folder, path, token_array(path, f.dtype))
        if manifest is None:
            missing.append(path)
            continue
        if manifest.get("version") == INDEX_VERSION and manifest.get("sample_step") != SAMPLE_STEP:
            raise DataError(
                f"{folder / 'manifest.json'}: sample_step {shown(manifest.get('sample_step'))}, this olmo-data reads "
                f"keys of every {SAMPLE_STEP}th suffix; rerun `olmo-data index CONFIG` to rebuild them, or trace "
                "with --no-index"
            )
        if manifest.get("version") != INDEX_VERSION:
            raise DataError(
                f"{folder}: this suffix index of {path} is in format {shown(manifest.get('version'))}, this "
                f"olmo-data reads format {INDEX_VERSION}; rerun `olmo-data index CONFIG` to rebuild it, or trace "
                "with --no-index"
            )
        stamp = file_stamp(path)
        if manifest.get("stamp") != stamp:
            what = stamp_change(manifest.get("stamp"), stamp)
            raise DataError(
                f"{folder}: this suffix index was built for another version of {path} ({what} "
                "changed); rerun `olmo-data index CONFIG` to update it (it checks the file's content and sorts only "
                "the shards that changed), or trace with --no-index"
            )
        if manifest.get("dtype") != f.dtype or manifest.get("num_tokens") != f.num_tokens:
            raise DataError(
                f"{folder / 'manifest.json'}: indexes {manifest.get('num_tokens')} {manifest.get('dtype')} tokens, "
                f"but the run reads {path} as {f.num_tokens} {f.dtype} tokens; rerun `olmo-data index CONFIG`"
            )
        found[path] = FileSuffixIndex(path, f.dtype, folder, manifest)
    if not found:
        return None
    if missing:
        raise DataError(
            f"{missing[0]}: no suffix index, though {len(found)} other token file(s) of the run have one; run "
            "`olmo-data index CONFIG` to index them all, or trace with --no-index"
        )
    return RunIndex(found, sum(int(len(i.tokens)) for i in found.values()), empty)
