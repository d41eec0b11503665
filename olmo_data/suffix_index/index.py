"""`olmo-data index`: suffix arrays over a run's token files, so that `trace --text/--tokens/--spans` look a
passage up in O(length x log tokens) reads instead of scanning every token.

The token files are neither copied nor re-tokenized: an index stores only suffix positions (uint32, 4 bytes a
token) into the existing file. Each token file gets a folder `suffix-index/NAME/` in its directory (or, with
`index_dir`, `DIR/<digest>-NAME/`, for read-only data; never a name tokenize's `part-*` patterns could match):

  shard-00000.u32 ...   the positions [a, b) of the file, relative to a, sorted by their suffix; a suffix is read
                        up to `window_end` = b + context (or the file's end), so a passage crossing a shard's end is
                        still found; the few positions whose window is shorter than a long query are checked
                        directly against the file, so answers stay exact at any length
  shard-00000.json      the shard's range and a checksum of its window: written after its positions, so a shard
                        with a .json is complete (both atomically)
  manifest.json         written last: the token file's size, modification time and a sampled checksum

Shards are built in bounded memory (about 64 bytes a token of a shard with numpy, 10 with divsufsort), in
parallel over processes, and a rerun skips done shards; a token file changed since its index was built makes
queries refuse the index, and a rerun rebuilds only the shards whose window checksum changed. A rerun that will
rewrite shards (the file or the settings changed) deletes the manifest first, and queries check that the shards
cover the file exactly, so a rebuild cut short never answers from a mix of old and new shards. Empty token files
hold no match and get no index.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset import DTYPES, InstanceSource
from olmo_data.display import bar_disabled
from olmo_data.errors import DataError, is_disk_full, shown
from olmo_data.io import (
    atomic_path,
    is_remote,
    remove_live_temporaries,
    remove_stale_temporaries,
    write_json_atomic,
)
from olmo_data.processes import pool_context
from olmo_data.suffix_index.parts import (
    finish,
    mine,
    refuse_unfinished,
    remove_beyond,
    window_hash,
    write_plan,
)
from olmo_data.suffix_index.search import (
    QUERY_ABOVE,
    Samples,
    bound_one,
    common_prefix,
    longest_one,
    lower_bound,
    smallest,
)
from olmo_data.suffix_index.sort import engine_name, suffix_array

INDEX_VERSION = 1
SHARD_TOKENS = 1 << 24  # positions per shard: ~1.1 GB peak per numpy worker
CONTEXT = 4096  # tokens a shard's suffixes are sorted by beyond its end
ROWS = 1 << 16  # pieces searched at once: their bookkeeping stays a few MB
FEW_ROWS = 16  # up to this many pieces, one at a time in plain Python costs less than the vectorised search
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 1 << 12


def index_folder(token_path: str, index_dir: str | None = None) -> Path:
    """Where the index of a token file lives: beside it, or in `index_dir` under a name that keeps two files of
    the same name apart."""
    if index_dir is None:
        return Path(token_path).parent / "suffix-index" / Path(token_path).name
    digest = hashlib.sha256(os.path.abspath(token_path).encode()).hexdigest()[:12]
    return Path(index_dir) / f"{digest}-{Path(token_path).name}"


def file_stamp(path: str) -> dict[str, Any]:
    """Size, modification time and a checksum of 16 evenly spaced 4 KiB blocks (the whole of a file under 64 KiB):
    cheap enough for every query (64 KiB read a file), and a second check where a rewrite keeps the size."""
    st = os.stat(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if st.st_size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            h.update(f.read())
        else:
            step = (st.st_size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)
            for k in range(SAMPLE_BLOCKS):
                f.seek(k * step)
                h.update(f.read(SAMPLE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": h.hexdigest()}


def token_array(path: str, dtype: str) -> np.ndarray:
    """A token file as a read-only memory map."""
    return np.memmap(path, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<"), mode="r")


@dataclass(frozen=True)
class ShardTask:
    path: str
    dtype: str
    folder: str
    shard: int
    start: int
    end: int
    window_end: int
    engine: str


def _build_shard(task: ShardTask) -> int:
    """Sort one shard's suffixes (read up to its window's end) and write its positions, then its .json."""
    tokens = token_array(task.path, task.dtype)
    window = np.asarray(tokens[task.start : task.window_end])
    order = suffix_array(window, task.engine)
    positions = order[order < task.end - task.start].astype(np.uint32)
    folder = Path(task.folder)
    with atomic_path(folder / f"shard-{task.shard:05d}.u32") as tmp:
        positions.astype("<u4").tofile(tmp)
    write_json_atomic(
        folder / f"shard-{task.shard:05d}.json",
        {
            "start": task.start,
            "end": task.end,
            "window_end": task.window_end,
            "window_hash": window_hash(tokens, task.start, task.window_end),
            "engine": task.engine,
        },
    )
    return task.end - task.start


def _shard_done(task: ShardTask, tokens: np.ndarray, trust: bool) -> bool:
    meta_path = Path(task.folder) / f"shard-{task.shard:05d}.json"
    data_path = Path(task.folder) / f"shard-{task.shard:05d}.u32"
    if not meta_path.exists() or not data_path.exists():
        return False
    try:  # a damaged record (cut short, edited) is a shard to build again
        meta = json.loads(meta_path.read_text())
        if (meta["start"], meta["end"], meta["window_end"]) != (task.start, task.end, task.window_end):
            return False
    except (ValueError, TypeError, KeyError):
        return False
    if data_path.stat().st_size != 4 * (task.end - task.start):
        return False
    return trust or meta["window_hash"] == window_hash(tokens, task.start, task.window_end)


@dataclass
class IndexSummary:
    files: int
    tokens: int
    shards: int
    built: int  # shards sorted by this run (the rest were done already)
    built_tokens: int
    seconds: float
    index_bytes: int
    engine: str
    messages: list[str]
    pending: int = 0  # with a part: shards other machines have not finished (no manifest for their files yet)

    @property
    def bytes_per_token(self) -> float:
        return self.index_bytes / max(self.tokens, 1)


def build_index(
    source: InstanceSource,
    *,
    index_dir: str | None = None,
    shard_tokens: int = SHARD_TOKENS,
    context: int = CONTEXT,
    processes: int = 1,
    engine: str = "auto",
    progress: bool | None = None,
    part: tuple[int, int] | None = None,
) -> IndexSummary:
    """Index every distinct token file of `source`; shards already done (and still matching their file) are kept.
    A full disk is one line naming where the index goes; the shards done so far are kept for the rerun. With
    `part` (I, N), sort only this machine's share of the shards (suffix_index/parts.py)."""
    try:
        return _build_index(source, index_dir, shard_tokens, context, processes, engine, progress, part)
    except OSError as e:
        if not is_disk_full(e):
            raise
        remove_live_temporaries()
        where = index_dir or "the suffix-index folders beside the token files"
        raise DataError(f"{where}: the disk is full ({e}); free space there and rerun (done shards are kept)") from e


def _build_index(
    source: InstanceSource,
    index_dir: str | None,
    shard_tokens: int,
    context: int,
    processes: int,
    engine: str,
    progress: bool | None,
    part: tuple[int, int] | None = None,
) -> IndexSummary:
    if shard_tokens < 1 or context < 1 or shard_tokens + context >= 1 << 32:
        raise DataError(f"shard_tokens {shard_tokens} and context {context}: expected positive, summing below 2**32")
    engine = engine_name(engine)
    files = {f.path: f for f in source.files}
    tasks: list[ShardTask] = []
    manifests: dict[str, dict[str, Any]] = {}
    messages: list[str] = []
    skipped, numbered = 0, 0
    every: dict[str, tuple[list[ShardTask], bool]] = {}  # each file's shards, and whether its old manifest holds
    for path, f in files.items():
        if is_remote(path):
            raise DataError(f"{path}: indexing reads whole token files; copy the token files here first")
        if f.num_tokens == 0:  # holds no match; a memory map of it cannot even be opened
            continue
        folder = index_folder(path, index_dir)
        stamp = file_stamp(path)
        try:
            old = _read_manifest(folder)
        except DataError as e:  # unreadable: rebuilt, as a manifest of other settings is
            messages.append(f"{e.args[0].split(';')[0]}: rebuilding the index")
            (folder / "manifest.json").unlink()
            old = None
        settings = {"version": INDEX_VERSION, "dtype": f.dtype, "shard_tokens": shard_tokens, "context": context}
        trust = old is not None and old.get("stamp") == stamp and all(old.get(k) == v for k, v in settings.items())
        if old is not None and not trust:  # shards are about to change: no manifest may vouch for a mix of them
            if old.get("stamp") != stamp:
                messages.append(f"{path} changed since its index was built: rebuilding the shards it changed")
            (folder / "manifest.json").unlink()
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(folder)  # a shard cut off mid-write by a killed build
        tokens = token_array(path, f.dtype)
        n = len(tokens)
        shards = [
            ShardTask(
                path, f.dtype, str(folder), k, a, min(a + shard_tokens, n), min(a + shard_tokens + context, n), engine
            )
            for k, a in enumerate(range(0, n, shard_tokens))
        ]
        remove_beyond(folder, len(shards))
        if part is not None and not trust:
            write_plan(folder, numbered, len(shards), part[1])
        for task in mine(shards, numbered, part):
            if _shard_done(task, tokens, trust):
                skipped += 1
            else:
                tasks.append(task)
        numbered += len(shards)
        every[path] = (shards, trust)
        manifests[path] = {
            **settings,
            "token_file": os.path.abspath(path),
            "num_tokens": n,
            "stamp": stamp,
            "shards": len(shards),
        }
    from tqdm import tqdm

    t0 = time.perf_counter()
    built_tokens = sum(t.end - t.start for t in tasks)
    with tqdm(total=built_tokens, unit=" tokens", unit_scale=True, desc="index", disable=bar_disabled(progress)) as bar:
        if processes <= 1 or len(tasks) <= 1:
            for task in tasks:
                bar.update(_build_shard(task))
        else:
            from olmo_data.interrupts import quiet_worker

            ctx = pool_context()
            with ctx.Pool(min(processes, len(tasks)), initializer=quiet_worker) as pool:
                for done in pool.imap_unordered(_build_shard, tasks):
                    bar.update(done)
    seconds = time.perf_counter() - t0
    index_bytes, pending = 0, 0
    for path, manifest in manifests.items():
        folder = index_folder(path, index_dir)
        if part is None:
            write_json_atomic(folder / "manifest.json", manifest)
        else:  # every shard checked (other machines' too) before a manifest vouches for them
            shards, trust = every[path]
            check = functools.partial(_shard_done, tokens=token_array(path, manifest["dtype"]), trust=trust)
            pending += finish(folder, manifest, shards, check)
        index_bytes += sum(p.stat().st_size for p in folder.iterdir())
    return IndexSummary(
        files=len(files),
        tokens=sum(m["num_tokens"] for m in manifests.values()),
        shards=len(tasks) + skipped,
        built=len(tasks),
        built_tokens=built_tokens,
        seconds=seconds,
        index_bytes=index_bytes,
        engine=engine,
        messages=messages,
        pending=pending,
    )


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DataError(f"{folder / 'manifest.json'}: not valid JSON ({e}); delete the folder and rerun index") from e
    shards = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
        what = "not a JSON object" if not isinstance(data, dict) else f'"shards" is {shown(shards)}, not a count'
        raise DataError(f"{folder / 'manifest.json'}: {what}; delete the folder and rerun index")
    return data


# -- queries ----------------------------------------------------------------------------------------------------


@dataclass
class Shard:
    start: int
    end: int
    window_end: int
    positions: np.ndarray  # uint32 memory map, relative to start
    sampled: Samples | None = None  # made at the first query

    def samples(self, tokens: np.ndarray) -> Samples:
        if self.sampled is None:
            self.sampled = Samples(tokens, self.positions, self.start, self.window_end)
        return self.sampled


class FileSuffixIndex:
    """The shards of one token file's index, and its tokens (a memory map). Pieces of a query are searched as
    (start, length) rows of one array (suffix_search), so that no row is ever copied out to the query's length."""

    def __init__(self, path: str, dtype: str, folder: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.tokens = np.asarray(token_array(path, dtype))
        self.shards: list[Shard] = []
        n = len(self.tokens)
        for k in range(int(manifest["shards"])):
            data = folder / f"shard-{k:05d}.u32"
            try:
                meta = json.loads((folder / f"shard-{k:05d}.json").read_text())
                size = data.stat().st_size
            except (OSError, ValueError):
                meta, size = {}, -1
            start, end, window_end = (int(meta.get(key, -1)) for key in ("start", "end", "window_end"))
            previous = self.shards[-1].end if self.shards else 0
            if start != previous or not start < end <= window_end <= n or size != 4 * (end - start):
                raise _not_covering(folder, path, n)
            positions = np.asarray(np.memmap(data, dtype="<u4", mode="r"))  # a plain view: cheaper to index
            self.shards.append(Shard(start, end, window_end, positions))
        if (self.shards[-1].end if self.shards else 0) != n:
            raise _not_covering(folder, path, n)

    def _near_end(self, shard: Shard, length: int) -> np.ndarray:
        """Positions of the shard whose window is too short to hold `length` tokens although the file goes on:
        these are checked against the file itself."""
        if shard.window_end >= len(self.tokens):
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
        for shard in self.shards:
            for r in range(len(starts)) if few else ():
                piece = query[int(starts[r]) : int(starts[r] + caps[r])]
                edges = shard.samples(self.tokens).bracket_one(piece, False, len(shard.positions))
                args = (self.tokens, shard.positions, shard.start, shard.window_end, piece)
                best[r] = max(int(best[r]), longest_one(*args, *edges))
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
                    samples=shard.samples(self.tokens),
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
            lo, _, _ = lower_bound(*args, samples=shard.samples(self.tokens))
            hi, _, _ = lower_bound(*args, above=True, samples=shard.samples(self.tokens))
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
                here = shard.start + smallest(shard.positions, int(lo[r]), int(hi[r]), int(quota[r]))
                if r in held:  # never in the interval: a window too short to hold the piece sorts it elsewhere
                    here = np.sort(np.concatenate([here, held[r]]))[: quota[r]]
                listed[r].append(here)
                quota[r] -= len(here)
        return counts, [np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in listed]

    def intervals(self, sequence: np.ndarray) -> list[tuple[Shard, int, int, np.ndarray]]:
        """Per shard: the ranks [lo, hi) of the suffixes that start with `sequence`, and the positions near its end
        that hold it although its window is too short to (checked against the file)."""
        m = len(sequence)
        out = []
        keys: tuple[bytes, bytes] | None = None
        for shard in self.shards:
            samples = shard.samples(self.tokens)
            keys = keys or (samples.key_one(sequence, False), samples.key_one(sequence, True))
            args = (self.tokens, shard.positions, shard.start, shard.window_end, sequence)
            lo = bound_one(*args, *samples.bracket_one(sequence, False, len(shard.positions), keys[0]))
            top_lo, top_hi = samples.bracket_one(sequence, True, len(shard.positions), keys[1])
            hi = bound_one(*args, max(lo, top_lo), top_hi, above=True)  # never below lo
            near = self._near_end(shard, m)
            if len(near):
                near = near[near + m > shard.window_end]
                zero = np.zeros(1, dtype=np.int64)
                near = near[self._near_prefixes(near, sequence, zero, zero + m)[0] >= m] if len(near) else near
            out.append((shard, lo, hi, near))
        return out

    def count(self, sequence: np.ndarray) -> int:
        """How many positions of the file hold `sequence`."""
        if not len(sequence):
            return 0
        return sum(hi - lo + len(near) for _, lo, hi, near in self.intervals(sequence))

    def find(self, sequence: np.ndarray) -> np.ndarray:
        """Every position where the file holds `sequence`, sorted."""
        if not len(sequence):
            return np.zeros(0, dtype=np.int64)
        found = [
            np.concatenate([shard.start + shard.positions[lo:hi].astype(np.int64), near])
            for shard, lo, hi, near in self.intervals(sequence)
        ]
        return np.sort(np.concatenate(found))


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

    def find(self, sequence: Sequence[int]) -> dict[str, np.ndarray]:
        seq = _never_past_end(sequence)
        out = {path: np.zeros(0, dtype=np.int64) for path in self.empty}
        return out | {path: index.find(seq) for path, index in self.files.items()}

    def count(self, sequence: Sequence[int]) -> int:
        """How many places of the token files hold `sequence` (infini-gram's count), without listing them."""
        seq = _never_past_end(sequence)
        return sum(index.count(seq) for index in self.files.values())

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
        manifest = None if is_remote(path) else _read_manifest(folder)
        if manifest is None and not is_remote(path):
            refuse_unfinished(folder, path, token_array(path, f.dtype))
        if manifest is None:
            missing.append(path)
            continue
        if manifest.get("version") != INDEX_VERSION or manifest.get("stamp") != file_stamp(path):
            raise DataError(
                f"{folder}: this suffix index was built for another version of {path} (its size, modification time "
                "or content changed); rerun `olmo-data index CONFIG` to update it, or trace with --no-index"
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
