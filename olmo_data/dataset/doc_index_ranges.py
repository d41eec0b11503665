"""Reading range-readable document index files (`doc_index_file`): local ones through a memory map, remote ones by
byte ranges, many files' ranges in one concurrent call of the process's remote reader.

Why: a batch touches hundreds of token files. Read one file after another, each lookup waits for its round trips
in turn (500 files x 2 reads x 50 ms = 50 s); gathered, the reads of all files go out together, `concurrency` at a
time, and the whole batch costs two round trips of requests (`prefetch`), after the heads (one round, once: they
are cached on disk).

The head cache: `<cache>/docindex/heads/<sha256 of URL, size and ETag, 32 hex>.head`, the first `head_size`
bytes of a remote index file (header, sample, sources: 35 KB for 1.5M documents). An index file is immutable
once written; one rewritten in place gets another size or ETag, so another entry. Every ranged read of the file
is checked against the size and ETag sized before it (`olmo_data.remote.sizes`), so a file changed since fails
that read naming it. Each entry is checked by its crc when read; any can be deleted at any time.

The answers cache: `<cache>/docindex/answers/<sha256 of the files' URLs, sizes, ETags and the ranges>.json`, what
`prefetch` found for one batch's ranges (their rows: start, end, loc, source code, id; ~100 bytes a document), so
that a batch looked at again (a repeated `inspect-batch`) reads nothing. Deleting it costs one read round again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset.doc_index_file import HASH, HEADER, LENGTH, ROW, Head, head_size_of, id_hash, parse_head
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, is_remote
from olmo_data.remote import remote_reader

WHOLE_CHUNK = 8 * 2**20  # a whole section (full columns) is read in ranged chunks of this size, concurrently
HEAD_GUESS = 32 * 1024  # bytes read first of a remote index not sized yet: a whole head up to ~1.3M documents
KEPT_BLOCKS = 256  # blocks of rows a file keeps in memory (a long-lived reader looking at many batches)


class RangeFileIndex:
    """One token file's documents, from its index file: the head in memory, blocks of rows and ids read as
    lookups need them (and kept). The same questions as the built index (`doc_index.FileIndex`), the same
    answers: `rows_between`, `docs`, `first_row_past`, `rows_with_ids`, and whole columns on demand."""

    def __init__(self, head: Head, location: str) -> None:
        self.head = head
        self.location = location
        self.sources = head.sources
        self.remote = is_remote(location)
        self._map: mmap.mmap | None = None
        if not self.remote:
            with open(location, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._blocks: dict[int, np.ndarray] = {}  # block number: its rows (and the next one)
        self._ids: dict[int, str] = {}  # row: its id
        self._rows: dict[int, tuple[int, int, int, int]] = {}  # row: (start, end, loc, src code), once looked up
        self._answers: dict[tuple[int, int], tuple[int, int]] = {}  # (start, end): rows_between's answer
        self._columns: np.ndarray | None = None
        self._blob: np.ndarray | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.head.documents

    @property
    def documents(self) -> int:
        return self.head.documents

    # -- reading bytes -------------------------------------------------------------------------------------

    def read(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes (offset, length) of this file; see `read_many` for many files at once."""
        return read_many([(self, o, n) for o, n in spans])

    # -- rows ----------------------------------------------------------------------------------------------

    def block_span(self, block: int) -> tuple[int, int]:
        lo, hi = self.head.block_rows(block)
        return self.head.spans_offset + lo * ROW.itemsize, (hi - lo) * ROW.itemsize

    def missing_blocks(self, blocks: Sequence[int]) -> list[int]:
        with self._lock:
            return [b for b in dict.fromkeys(blocks) if b not in self._blocks and 0 <= b < self.head.blocks]

    def keep_blocks(self, blocks: Sequence[int], data: Sequence[bytes]) -> None:
        with self._lock:
            for b, raw in zip(blocks, data, strict=True):
                self._blocks[b] = np.frombuffer(raw, dtype=ROW)
            while len(self._blocks) > KEPT_BLOCKS:
                self._blocks.pop(next(iter(self._blocks)))

    def ensure_blocks(self, blocks: Sequence[int]) -> None:
        if missing := self.missing_blocks(blocks):
            self.keep_blocks(missing, self.read([self.block_span(b) for b in missing]))

    def _block(self, block: int) -> np.ndarray:
        with self._lock:
            rows = self._blocks.get(block)
        if rows is None:
            self.ensure_blocks([block])
            with self._lock:
                rows = self._blocks[block]
        return rows

    def row(self, k: int) -> np.void:
        """Row k (0 <= k < documents), from the block that holds it."""
        block, at = divmod(k, self.head.sample_every)
        with self._lock:
            if block not in self._blocks and at == 0 and block - 1 in self._blocks:
                return self._blocks[block - 1][self.head.sample_every]  # the extra row of the block before
        return self._block(block)[at]

    def blocks_for(self, start: int, end: int) -> list[int]:
        """The blocks `rows_between(start, end)` reads."""
        if self.head.documents == 0:
            return []
        lo, hi = self.head.blocks_for(start, end)
        return list(range(lo, hi + 1))

    def rows_between(self, start: int, end: int) -> tuple[int, int]:
        """(first, last): rows [first, last) are the documents overlapping tokens [start, end), as the built
        index finds them (the first row ending after `start`, the first starting at or after `end`)."""
        head, k = self.head, self.head.sample_every
        if head.documents == 0:
            return 0, 0
        with self._lock:
            if (start, end) in self._answers:
                return self._answers[(start, end)]
        ie = int(np.searchsorted(head.sample_ends, start, side="right"))
        ib = int(np.searchsorted(head.sample_starts, end, side="left"))
        self.ensure_blocks(self.blocks_for(start, end))
        first = 0 if ie == 0 else (ie - 1) * k + int(np.searchsorted(self._block(ie - 1)["end"][:k], start, "right"))
        last = 0 if ib == 0 else (ib - 1) * k + int(np.searchsorted(self._block(ib - 1)["start"][:k], end, "left"))
        with self._lock:
            self._answers[(start, end)] = (first, last)
        return first, last

    def knows(self, start: int, end: int) -> bool:
        """Whether the documents of tokens [start, end) are known without reading (looked up before)."""
        with self._lock:
            answer = self._answers.get((start, end))
            return answer is not None and all(r in self._rows and r in self._ids for r in range(*answer))

    def first_row_past(self, num_tokens: int) -> tuple[int, int] | None:
        """(row, its end) of the first row ending past token `num_tokens`, None if none does."""
        if self.head.documents == 0 or self.head.max_end <= num_tokens:
            return None
        b = self.head.block_for_end(num_tokens)
        ends = self._block(b)["end"][: self.head.sample_every]
        row = b * self.head.sample_every + int(np.searchsorted(ends, num_tokens, side="right"))
        return row, int(self.row(row)["end"])

    # -- ids -----------------------------------------------------------------------------------------------

    def id_span(self, first: int, last: int) -> tuple[int, int] | None:
        """The bytes of the ids section holding rows [first, last)'s ids (None: none needed, or all known)."""
        with self._lock:
            if all(r in self._ids for r in range(first, last)):
                return None
        lo = int(self.row(first)["id"])
        hi = int(self.row(last)["id"]) if last < self.head.documents else self.head.id_bytes
        return self.head.ids_offset + lo, hi - lo

    def keep_ids(self, first: int, last: int, data: bytes) -> None:
        base = int(self.row(first)["id"])
        offsets = [int(self.row(r)["id"]) - base for r in range(first, last)] + [len(data)]
        with self._lock:
            for r, a, b in zip(range(first, last), offsets, offsets[1:], strict=False):
                self._ids[r] = data[a:b].decode("utf-8")

    def known_id(self, k: int) -> str | None:
        with self._lock:
            return self._ids.get(k)

    def docs(self, first: int, last: int) -> list[tuple[str, str, int, int, int]]:
        """(id, src, loc, start, end) of rows [first, last)."""
        if first >= last:
            return []
        with self._lock:
            known = all(r in self._rows and r in self._ids for r in range(first, last))
        if not known:
            if (span := self.id_span(first, last)) is not None:
                self.keep_ids(first, last, self.read([span])[0])
            rows = {r: self.row(r) for r in range(first, last)}
            with self._lock:
                self._rows.update(
                    {r: (int(w["start"]), int(w["end"]), int(w["loc"]), int(w["src"])) for r, w in rows.items()}
                )
        out = []
        with self._lock:
            for r in range(first, last):
                start, end, loc, src = self._rows[r]
                out.append((self._ids[r], self.sources[src], loc, start, end))
        return out

    def remembered(self, ranges: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """What lookups of these ranges found (for the answers cache): each range's rows, and those rows."""
        with self._lock:
            answers = [[s, e, *self._answers[(s, e)]] for s, e in ranges if (s, e) in self._answers]
            rows = sorted({r for _, _, a, b in answers for r in range(a, b)})
            return {"ranges": answers, "rows": [[r, *self._rows[r], self._ids[r]] for r in rows]}

    def remember(self, found: dict[str, Any]) -> None:
        """Take what `remembered` gave (from the answers cache): those lookups then read nothing."""
        with self._lock:
            for s, e, a, b in found["ranges"]:
                self._answers[(int(s), int(e))] = (int(a), int(b))
            for r, start, end, loc, src, doc_id in found["rows"]:
                self._rows[int(r)] = (int(start), int(end), int(loc), int(src))
                self._ids[int(r)] = str(doc_id)

    def doc(self, k: int) -> tuple[str, str, int, int, int]:
        return self.docs(k, k + 1)[0]

    def rows_with_ids(self, ids: Sequence[str]) -> list[int]:
        """The rows whose id is one of `ids` (ascending): a block of hashes per id, then the candidates' ids."""
        return rows_with_ids_many([self], ids)[0]

    # -- whole columns (what a scan of every document needs: stats, a source's documents) ------------------

    def _whole(self, offset: int, size: int) -> bytes | memoryview:
        if self._map is not None:  # (a view of the map: no copy)
            return memoryview(self._map)[offset : offset + size]
        spans = [(o, min(WHOLE_CHUNK, offset + size - o)) for o in range(offset, offset + size, WHOLE_CHUNK)]
        return b"".join(self.read(spans))

    @property
    def columns(self) -> np.ndarray:
        """Every row (start, end, id offset, loc, src): the whole rows section, read once."""
        if self._columns is None:
            raw = self._whole(self.head.spans_offset, self.head.documents * ROW.itemsize)
            self._columns = np.frombuffer(raw, dtype=ROW)
        return self._columns

    @property
    def starts(self) -> np.ndarray:
        return self.columns["start"]

    @property
    def ends(self) -> np.ndarray:
        return self.columns["end"]

    @property
    def locs(self) -> np.ndarray:
        return self.columns["loc"]

    @property
    def src_codes(self) -> np.ndarray:
        return self.columns["src"]

    @property
    def id_offsets(self) -> np.ndarray:
        return self.columns["id"].astype(np.int64)

    @property
    def ids(self) -> np.ndarray:
        """Every id's bytes, back to back (uint8)."""
        if self._blob is None:
            self._blob = np.frombuffer(self._whole(self.head.ids_offset, self.head.id_bytes), dtype=np.uint8)
        return self._blob

    def length_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct document lengths ascending, how many documents have each): one read of the lengths section."""
        raw = self._whole(self.head.lengths_offset, self.head.distinct_lengths * LENGTH.itemsize)
        table = np.frombuffer(raw, dtype=LENGTH)
        return table["length"].copy(), table["count"].copy()


def read_many(reads: Sequence[tuple[RangeFileIndex, int, int]]) -> list[bytes]:
    """Bytes (offset, length) of many index files: local ones from their maps, remote ones in one call of the
    remote reader (concurrent, coalesced, retried, checked against the sizes it was sized with)."""
    out: list[bytes] = [b""] * len(reads)
    remote = [i for i, (f, _, _) in enumerate(reads) if f.remote]
    for i, (f, offset, length) in enumerate(reads):
        if not f.remote:
            if f._map is None or offset + length > len(f._map):
                raise DataError(
                    f"{f.location}: document index cut short (bytes {offset}..{offset + length - 1} "
                    "asked); rebuild it with `olmo-data index-documents --force`"
                )
            out[i] = f._map[offset : offset + length]
    if remote:
        got = remote_reader().read_many([(reads[i][0].location, reads[i][1], reads[i][2]) for i in remote])
        for i, data in zip(remote, got, strict=True):
            out[i] = data
    return out


def fetch_blocks(wanted: Sequence[tuple[RangeFileIndex, int]]) -> None:
    """Read the blocks of rows (file, block) not kept yet, every file's at once."""
    todo = list({(id(f), b): (f, b) for f, b in wanted if f.missing_blocks([b])}.values())
    data = read_many([(f, *f.block_span(b)) for f, b in todo])
    for (f, b), raw in zip(todo, data, strict=True):
        f.keep_blocks([b], [raw])


def prefetch(wanted: Sequence[tuple[RangeFileIndex, int, int]]) -> None:
    """Read what the lookups of these (index, start, end) need, every file's at once: the blocks of rows (one
    concurrent round), then their ids (another). Lookups then read nothing."""
    wanted = [(f, s, e) for f, s, e in wanted if not f.knows(s, e)]
    fetch_blocks([(f, b) for f, s, e in wanted for b in f.blocks_for(s, e)])
    spans = []
    for f, s, e in wanted:
        first, last = f.rows_between(s, e)
        if first < last and (span := f.id_span(first, last)) is not None:
            spans.append((f, first, last, span))
    for (f, first, last, _), raw in zip(spans, read_many([(f, *span) for f, _, _, span in spans]), strict=True):
        f.keep_ids(first, last, raw)
    for f, s, e in wanted:
        f.docs(*f.rows_between(s, e))  # (kept: what the answers cache stores)


def answers_key(wanted: Sequence[tuple[RangeFileIndex, str | None, int, int]]) -> str:
    """The answers cache's name for a batch of lookups: its files (location, size, ETag) and ranges."""
    h = hashlib.sha256()
    for f, etag, s, e in wanted:
        h.update(f"{f.location}\n{f.head.file_size}\n{etag or ''}\n{s}\n{e}\n".encode())
    return h.hexdigest()[:32]


def load_answers(path: Path, wanted: Sequence[tuple[RangeFileIndex, int, int]]) -> bool:
    """Take a batch's answers from the cache file `path` (False: none there, or unreadable)."""
    try:
        found = json.loads(path.read_text())
        by_location = {f.location: f for f, _, _ in wanted}
        for location, answers in found["files"].items():
            by_location[location].remember(answers)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    return True


def save_answers(path: Path, wanted: Sequence[tuple[RangeFileIndex, int, int]]) -> None:
    """Keep a batch's answers (its ranges' rows, ids and sources codes: ~100 bytes a document) for a later call."""
    ranges: dict[str, tuple[RangeFileIndex, list[tuple[int, int]]]] = {}
    for f, s, e in wanted:
        ranges.setdefault(f.location, (f, []))[1].append((s, e))
    data = {"files": {location: f.remembered(r) for location, (f, r) in ranges.items()}}
    with contextlib.suppress(OSError), atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, separators=(",", ":")))


def rows_with_ids_many(files: Sequence[RangeFileIndex], ids: Sequence[str]) -> list[list[int]]:
    """For each file, its rows whose id is one of `ids` (ascending). Three concurrent rounds for all files: the
    blocks of sorted hashes where each id's hash would be, the candidate rows (their id offsets), their ids."""
    names = set(ids)
    values = np.array(sorted({id_hash(i.encode("utf-8")) for i in names}), dtype=np.uint64)
    plan: dict[tuple[int, int], tuple[RangeFileIndex, int]] = {}
    for f in files:
        samples = f.head.sample_hashes
        for value in values if f.head.documents else []:
            lo = max(int(np.searchsorted(samples, value, side="left")) - 1, 0)
            hi = max(int(np.searchsorted(samples, value, side="right")) - 1, 0)
            plan.update({(id(f), b): (f, b) for b in range(lo, hi + 1)})
    reads = []
    for f, b in plan.values():
        lo = b * f.head.sample_every
        hi = min(f.head.documents, lo + f.head.sample_every)
        reads.append((f, f.head.hashes_offset + lo * HASH.itemsize, (hi - lo) * HASH.itemsize))
    candidates: dict[int, set[int]] = {id(f): set() for f in files}
    for (f, _, _), raw in zip(reads, read_many(reads), strict=True):
        entries = np.frombuffer(raw, dtype=HASH)
        at = np.minimum(np.searchsorted(values, entries["hash"]), len(values) - 1)  # (np.isin: ~1 ms a call)
        candidates[id(f)].update(entries["row"][values[at] == entries["hash"]].astype(int).tolist())
    by_file = [(f, sorted(candidates[id(f)])) for f in files]
    fetch_blocks([(f, r // f.head.sample_every) for f, rows in by_file for r in rows])
    todo = [(f, r, span) for f, rows in by_file for r in rows if (span := f.id_span(r, r + 1)) is not None]
    for (f, r, _), raw in zip(todo, read_many([(f, *span) for f, _, span in todo]), strict=True):
        f.keep_ids(r, r + 1, raw)
    return [[r for r in rows if f.known_id(r) in names] for f, rows in by_file]


def head_cache_path(root: Path, url: str, size: int, etag: str | None) -> Path:
    digest = hashlib.sha256(f"{url}\n{size}\n{etag or ''}".encode()).hexdigest()[:32]
    return root / "heads" / f"{digest}.head"


def open_indexes(
    found: dict[str, tuple[int, str | None]], root: Path, starts: dict[str, bytes] | None = None
) -> dict[str, RangeFileIndex | DataError]:
    """Open the index files `found` names ({location: (size, ETag)}): a local one by reading its head, a remote
    one from the head cache, from its first bytes in `starts` (read when it was sized), or, for all the others,
    in one concurrent round of ranged reads (two for heads larger than guessed). A file that is no valid index
    (damaged, cut short, another version) is its DataError."""
    starts = starts or {}
    out: dict[str, RangeFileIndex | DataError] = {}
    heads: dict[str, bytes] = {}
    todo: list[str] = []
    for location, (size, etag) in found.items():
        if not is_remote(location):
            with open(location, "rb") as f:
                first = f.read(HEADER.size)
                try:
                    heads[location] = first + f.read(max(0, head_size_of(first, location) - len(first)))
                except DataError as e:
                    out[location] = e
            continue
        cached = head_cache_path(root, location, size, etag)
        with contextlib.suppress(OSError):
            data = cached.read_bytes()
            with contextlib.suppress(DataError):
                parse_head(data, location)
                heads[location] = data
                continue
        todo.append(location)
    if todo:
        unread = [u for u in todo if u not in starts]
        guess = {u: min(found[u][0], 8192 + found[u][0] // 1024) for u in unread}
        got = {u: starts[u] for u in todo if u in starts}
        got.update(zip(unread, remote_reader().read_many([(u, 0, guess[u]) for u in unread]), strict=True))
        more: list[tuple[str, int, int]] = []
        for u, data in got.items():
            try:
                need = head_size_of(data, u)
            except DataError as e:
                out[u] = e
                continue
            if need > len(data):
                more.append((u, len(data), need - len(data)))
        for (u, _, _), data in zip(more, remote_reader().read_many(more), strict=True):
            got[u] += data
        for u in todo:
            if u not in out:
                heads[u] = got[u]
    for location, data in heads.items():
        try:
            head = parse_head(data, location)
            if head.file_size != found[location][0]:
                raise DataError(
                    f"{location}: document index of {found[location][0]} bytes, its header says "
                    f"{head.file_size}: cut short or rewritten; rebuild it with `olmo-data index-documents`"
                )
            out[location] = RangeFileIndex(head, location)
        except DataError as e:
            out[location] = e
            continue
        if location in todo:
            size, etag = found[location]
            with contextlib.suppress(OSError), atomic_path(head_cache_path(root, location, size, etag)) as tmp:
                tmp.write_bytes(data[: head.head_size])
    return out
