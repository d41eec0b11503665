"""The document side index: which documents a run of tokens of a token file holds, from the tokenize metadata.

Two indexes answer alike (the same `DocumentSpan` lists):

* the range-readable index file (`doc_index_file`: `part-N.docs.idx` beside the `.csv.gz`, written once by
  `olmo-data index-documents`, or in `<cache>/docindex/files/`): used wherever it is found and current (it
  records the size of the metadata it was built from). Only its head (35 KB for 1.5M documents; remote ones
  cached on disk) and the blocks a lookup needs are read, by byte range: no metadata file is downloaded.
  `DocIndex.prepare` with the batch's token ranges reads every file's blocks in two concurrent rounds.
* without one, the side index built from the whole metadata file (`FileIndex`): sorted document starts and ends
  as `.npy` arrays plus the ids and sources, in a cache directory. A lookup is two binary searches on memory
  maps, so inspecting a batch, counting documents or tracing one never scans a CSV, whatever the dataset size;
  but building it downloads and parses the whole `.csv.gz` once per cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset.doc_index_file import SAMPLE_EVERY, index_path_for, read_metadata, write_index_file
from olmo_data.dataset.doc_index_ranges import (
    HEAD_GUESS,
    RangeFileIndex,
    answers_key,
    load_answers,
    open_indexes,
    prefetch,
    rows_with_ids_many,
    save_answers,
)
from olmo_data.dataset.manifest import Manifests
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, default_cache_dir, file_sizes, is_remote, remote_stats_and_starts

log = logging.getLogger(__name__)

DOCINDEX_VERSION = 2
INDEX_JSON = "index.json"


def metadata_path_for(token_path: str, manifests: Manifests | None = None) -> str | None:
    """The `.csv.gz` beside a token file: the manifest's `metadata` entry, else dolma's naming (same stem).
    `manifests` reads each directory's manifest once (thousands of remote files share one)."""
    directory, _, name = token_path.rpartition("/")
    with contextlib.suppress(DataError):
        manifest = (manifests or Manifests()).get(directory or ".")
        if manifest:
            for entry in manifest.get("files", []):
                if entry.get("path") == name and entry.get("metadata"):
                    return f"{directory}/{entry['metadata']}"
    candidate = dolma_metadata(token_path)
    if candidate is None or (not is_remote(candidate) and not os.path.exists(candidate)):
        return None
    return candidate


def dolma_metadata(token_path: str) -> str | None:
    """dolma's name for a token file's metadata: the same stem, `.csv.gz` (None unless the file is `.npy`)."""
    return token_path[: -len(".npy")] + ".csv.gz" if token_path.endswith(".npy") else None


@dataclass(frozen=True)
class DocumentSpan:
    """A document an instance overlaps: its identity, its token span in the file, and the overlap."""

    id: str
    src: str
    loc: int  # 1-based line of the document in `src`
    start: int  # document's token span in the token file [start, end)
    end: int
    instance_start: int  # the overlap, as positions within the instance [instance_start, instance_end)
    instance_end: int
    document_start: int  # which token of the document the overlap starts at (0: the instance holds its start)


class FileIndex:
    """One token file's document index: `spans.npy`, an int64 (documents, 5) Fortran-order array whose columns
    (start, end, loc, src code, id offset) are each contiguous, so binary searches run on the memory map without
    copies; `ids.bin`, the ids' UTF-8 bytes back to back; `index.json`, the sources (written last: "complete")."""

    def __init__(self, directory: Path) -> None:
        info = json.loads((directory / INDEX_JSON).read_text())
        spans = np.load(directory / "spans.npy", mmap_mode="r").view(np.ndarray)  # plain views index faster
        self.starts, self.ends, self.locs, self.src_codes, self.id_offsets = (spans[:, c] for c in range(5))
        self.ids = np.zeros(0, dtype=np.uint8)
        if info["id_bytes"]:  # (an empty file cannot be memory-mapped)
            self.ids = np.memmap(directory / "ids.bin", dtype=np.uint8, mode="r").view(np.ndarray)
        self.sources: list[str] = info["sources"]

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def documents(self) -> int:
        return len(self.starts)

    def doc(self, k: int) -> tuple[str, str, int, int, int]:
        lo = int(self.id_offsets[k])
        hi = int(self.id_offsets[k + 1]) if k + 1 < len(self.id_offsets) else len(self.ids)
        return (
            self.ids[lo:hi].tobytes().decode("utf-8"),
            self.sources[int(self.src_codes[k])],
            int(self.locs[k]),
            int(self.starts[k]),
            int(self.ends[k]),
        )

    def docs(self, first: int, last: int) -> list[tuple[str, str, int, int, int]]:
        """(id, src, loc, start, end) of rows [first, last)."""
        return [self.doc(k) for k in range(first, last)]

    def rows_between(self, start: int, end: int) -> tuple[int, int]:
        """(first, last): rows [first, last) are the documents overlapping tokens [start, end)."""
        first = int(np.searchsorted(self.ends, start, side="right"))  # first document ending after `start`
        last = int(np.searchsorted(self.starts, end, side="left"))  # documents starting before `end`
        return first, last

    def first_row_past(self, num_tokens: int) -> tuple[int, int] | None:
        """(row, its end) of the first row ending past token `num_tokens`, None if none does."""
        past = np.flatnonzero(np.asarray(self.ends) > num_tokens)
        return (int(past[0]), int(self.ends[past[0]])) if len(past) else None

    def rows_with_ids(self, ids: Sequence[str]) -> list[int]:
        """The rows whose id is one of `ids` (ascending)."""
        names = {i.encode("utf-8") for i in ids}
        blob = self.ids.tobytes() if len(self.ids) else b""
        starts = np.asarray(self.id_offsets).tolist()
        ends = [*starts[1:], len(blob)][: len(starts)]
        return [k for k, (a, b) in enumerate(zip(starts, ends, strict=True)) if blob[a:b] in names]

    def length_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct document lengths ascending, how many documents have each)."""
        values, counts = np.unique(np.asarray(self.ends) - np.asarray(self.starts), return_counts=True)
        return values.astype(np.int64), counts.astype(np.int64)


Index = FileIndex | RangeFileIndex


@dataclass(frozen=True)
class WrittenIndex:
    """What `DocIndex.write_files` did for one metadata file."""

    metadata: str
    path: str  # the index file (local)
    documents: int
    bytes: int
    skipped: bool  # an index of this very metadata (its size) was there already


class DocIndex:
    """Document lookups by token offset: from a token file's range-readable index file where there is one, else
    from a side index built once from the tokenize metadata.

    The built index of a metadata file lives in `cache_dir/docindex/<digest>/`, where the digest covers the
    metadata file's location, size and modification time: a rewritten metadata file gets a new index, never a
    stale one. Building is atomic (a temporary directory renamed into place), so concurrent users cannot see half
    an index. Index files are looked for beside the metadata (`part-N.docs.idx`), then in
    `cache_dir/docindex/files/` (`write_files(..., where="cache")`); one built from a metadata file of another size
    is passed over, with a warning.
    """

    def __init__(self, cache_dir: str | None = None) -> None:
        self.root = Path(cache_dir or default_cache_dir()) / "docindex"
        self._files: dict[str, Index | None] = {}
        self._sizes: dict[str, int | None] = {}  # remote metadata files' sizes (part of their index's key)
        self._ranged: dict[str, RangeFileIndex | None] = {}  # metadata: its index file, None: none usable
        self._found: dict[str, tuple[int, str | None]] = {}  # remote index files there: (size, ETag)
        self._probed: set[str] = set()  # remote index files looked for
        self._starts: dict[str, bytes] = {}  # the first bytes of those, read with their probe (until opened)
        self._manifests = Manifests()  # token directories' manifests, each read once
        self._lock = threading.Lock()
        self.built = 0  # how many indexes this object had to build (tests check that lookups reuse them)

    def prepare(self, files: Iterable[tuple[Any, ...]]) -> None:
        """Get ready to look up these (token file, metadata) pairs, doing at once what one lookup after another
        would do in turn: size the remote metadata files, then the index files beside those there (a concurrent
        round of HEAD requests each, cached on disk), read the heads of the index files found, build the side
        indexes of the rest (each a download and a parse). Items (token file, metadata, start, end) also read
        what the lookups of tokens [start, end) need from index files: every file's blocks at once, then their
        ids; the answers of remote ones are kept in `<cache>/docindex/answers/` (by the files' URL, size, ETag
        and the ranges), so the same batch asked again reads nothing. A batch touches up to hundreds of files; in
        turn, each would cost network round trips."""
        items = list(files)
        with self._lock:  # (a file without a known metadata path: the one beside it, if any)
            named = {t: m or metadata_path_for(t, self._manifests) for t, m, *_ in items if t not in self._files}
            todo = {m for m in named.values() if m}
        self._size_remote(sorted(todo))
        with self._lock:
            todo = {m for m in todo if not is_remote(m) or self._sizes.get(m) is not None}  # (absent: no index)
        self._open_ranged(sorted(todo))
        with self._lock:
            todo = {m for m in todo if self._ranged.get(m) is None}
            missing = {m: d for m in sorted(todo) if not ((d := self.root / self._key(m)) / INDEX_JSON).exists()}
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(build_doc_index, missing, missing.values()))
            with self._lock:
                self.built += len(missing)
        wanted = []
        with self._lock:  # (the index files found above; `index_for` checks rows against token counts later)
            for t, m, *span in items:
                known = self._files.get(t)
                found = known if t in self._files else self._ranged.get(m or named.get(t) or "")
                if span and isinstance(found, RangeFileIndex):
                    wanted.append((found, int(span[0]), int(span[1])))
        remote = [(f, s, e) for f, s, e in wanted if f.remote]
        if remote:  # a batch looked at before: its answers from the disk cache, no request
            key = answers_key([(f, self._found.get(f.location, (0, None))[1], s, e) for f, s, e in remote])
            answers = self.root / "answers" / f"{key}.json"
            if not load_answers(answers, remote):
                prefetch(remote)
                save_answers(answers, remote)
        prefetch([(f, s, e) for f, s, e in wanted if not f.remote])

    def metadata_of(self, token_path: str) -> str | None:
        """A token file's metadata: its manifest's entry, else the `.csv.gz` of the same stem (remote: not probed)."""
        with self._lock:
            return metadata_path_for(token_path, self._manifests)

    def _size_remote(self, metadata: Sequence[str]) -> None:
        """Size the remote metadata files not sized yet (one concurrent round of HEADs, cached on disk), then
        probe the index files beside those that are there (another round, cached alike)."""
        with self._lock:
            urls = [m for m in dict.fromkeys(metadata) if is_remote(m) and m not in self._sizes]
        if urls:
            sizes = file_sizes(urls, missing_ok=True)  # a 404: no documents
            with self._lock:
                self._sizes.update(zip(urls, sizes, strict=True))
        with self._lock:
            there = [m for m in dict.fromkeys(metadata) if is_remote(m) and self._sizes.get(m) is not None]
            probe = [index_path_for(m) for m in there if index_path_for(m) not in self._probed]
        if probe:
            found, starts = _probe(probe)
            with self._lock:
                self._probed.update(probe)
                self._found.update(found)
                self._starts.update(starts)

    def _open_ranged(self, metadata: Sequence[str]) -> None:
        """Find and open the index files of these metadata files (those not looked for yet)."""
        with self._lock:
            todo = [m for m in metadata if m not in self._ranged]
            candidates: dict[str, tuple[str, tuple[int, str | None]]] = {}
            for m in todo:
                if self._metadata_size(m) is None:  # no metadata there: no documents, or its error when built
                    continue
                for path in (index_path_for(m), str(self.cache_file_for(m))):
                    if is_remote(path) and path in self._found:
                        candidates[m] = (path, self._found[path])
                        break
                    if not is_remote(path) and os.path.isfile(path):
                        candidates[m] = (path, (os.path.getsize(path), None))
                        break
            starts = {path: self._starts.pop(path) for path, _ in candidates.values() if path in self._starts}
        opened = open_indexes(dict(candidates.values()), self.root, starts) if candidates else {}
        with self._lock:
            for m in todo:
                index: RangeFileIndex | DataError | None = None
                if m in candidates:
                    index = opened[candidates[m][0]]
                if isinstance(index, DataError):
                    log.warning("%s; using the index built from the whole metadata instead", index)
                    index = None
                size = self._metadata_size(m)
                if index is not None and index.head.metadata_size != size:
                    log.warning(
                        "%s: built from a metadata file of %d bytes, %s now has %d: passed over (rebuild it with "
                        "`olmo-data index-documents %s`)",
                        index.location, index.head.metadata_size, m, size, m,
                    )  # fmt: skip
                    index = None
                self._ranged[m] = index

    def _metadata_size(self, metadata: str) -> int | None:
        if is_remote(metadata):
            return self._remote_size(metadata)
        return os.path.getsize(metadata) if os.path.isfile(metadata) else None

    def _remote_size(self, metadata: str) -> int | None:
        """A remote metadata file's size, None when it is not there (a token file without documents, as a local
        token file without its .csv.gz is)."""
        if metadata not in self._sizes:
            self._sizes[metadata] = file_sizes([metadata], missing_ok=True)[0]
        return self._sizes[metadata]

    def _absent(self, metadata: str) -> bool:
        return is_remote(metadata) and self._remote_size(metadata) is None

    def _key(self, metadata: str) -> str:
        if is_remote(metadata):
            stamp = f"{metadata}|{self._remote_size(metadata)}"
        else:
            st = os.stat(metadata)
            stamp = f"{os.path.abspath(metadata)}|{st.st_size}|{st.st_mtime_ns}"
        return hashlib.sha256(f"v{DOCINDEX_VERSION}|{stamp}".encode()).hexdigest()[:24]

    def cache_file_for(self, metadata: str) -> Path:
        """Where `write_files(..., where="cache")` puts the index file of `metadata`: `<root>/files/<digest>`,
        the digest of its location and size (and, local, modification time): a rewritten file has another."""
        return self.root / "files" / f"{self._key(metadata)}.docs.idx"

    def index_for(self, token_path: str, metadata: str | None = None, num_tokens: int | None = None) -> Index | None:
        """The document index of a token file: its index file, else its side index, built on first use; None
        when the file has no metadata.

        `metadata` is the file's `.csv.gz` when known (`TokenFile.metadata_path`, from the manifest); else it is
        looked up beside the token file. With `num_tokens` (the token file's length) every row must end within
        the file: a row running past it would attribute every later instance to that one document.
        """
        with self._lock:
            if token_path in self._files:
                return self._files[token_path]
            metadata = metadata or metadata_path_for(token_path, self._manifests)
            if metadata is not None and metadata == dolma_metadata(token_path) and self._absent(metadata):
                metadata = None  # dolma's .csv.gz absent remotely (404): no documents, as a local file without one
        index: Index | None = None
        if metadata is not None:
            if metadata not in self._ranged:
                self._size_remote([metadata])
                self._open_ranged([metadata])
            index = self._ranged[metadata]
            if index is None:
                with self._lock:
                    directory = self.root / self._key(metadata)
                    if not (directory / INDEX_JSON).exists():
                        build_doc_index(metadata, directory)
                        self.built += 1
                index = FileIndex(directory)
            if num_tokens is not None:
                check_rows_within(index, metadata, token_path, num_tokens)
        with self._lock:
            self._files[token_path] = index
        return index

    def lookup(
        self, token_path: str, start: int, end: int, metadata: str | None = None, num_tokens: int | None = None
    ) -> list[DocumentSpan] | None:
        """The documents overlapping tokens [start, end) of a token file, in order; None without metadata."""
        index = self.index_for(token_path, metadata, num_tokens)
        if index is None:
            return None
        first, last = index.rows_between(start, end)
        out = []
        for doc_id, src, loc, d_start, d_end in index.docs(first, last):
            lo = max(d_start, start)
            out.append(
                DocumentSpan(doc_id, src, loc, d_start, d_end, lo - start, min(d_end, end) - start, lo - d_start)
            )
        return out

    def rows_with_ids(self, indexes: Sequence[Index], ids: Sequence[str]) -> list[list[int]]:
        """For each index, its rows whose id is one of `ids`: index files' in three concurrent rounds for all."""
        ranged = [i for i in indexes if isinstance(i, RangeFileIndex)]
        found = dict(zip(map(id, ranged), self._ranged_rows_with_ids(ranged, ids), strict=True))
        return [found[id(i)] if isinstance(i, RangeFileIndex) else i.rows_with_ids(ids) for i in indexes]

    def _ranged_rows_with_ids(self, ranged: Sequence[RangeFileIndex], ids: Sequence[str]) -> list[list[int]]:
        """`rows_with_ids_many`, its answer for remote index files kept in `<cache>/docindex/answers/ids-*.json`
        (by the files' location, size and ETag and the ids): a repeated trace of a document among 3,000 remote
        index files reads no hash blocks (three rounds of 3,000 ranged reads, ~6 s at 50 ms)."""
        if not ranged or not all(f.remote for f in ranged):
            return rows_with_ids_many(ranged, ids)
        h = hashlib.sha256("\n".join(sorted(set(ids))).encode())
        for f in ranged:
            h.update(f"\n{f.location}\n{f.head.file_size}\n{self._found.get(f.location, (0, None))[1] or ''}".encode())
        path = self.root / "answers" / f"ids-{h.hexdigest()[:32]}.json"
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            kept = json.loads(path.read_text())
            return [[int(r) for r in kept[f.location]] for f in ranged]
        found = rows_with_ids_many(ranged, ids)
        with contextlib.suppress(OSError), atomic_path(path) as tmp:  # (which makes its folder)
            tmp.write_text(json.dumps({f.location: rows for f, rows in zip(ranged, found, strict=True)}))
        return found

    def write_files(
        self,
        metadata: Sequence[str],
        where: str = "beside",
        *,
        force: bool = False,
        sample_every: int = SAMPLE_EVERY,
        on_done: Any = None,
    ) -> list[WrittenIndex]:
        """Write the range-readable index file of each metadata file: `where` "beside" (local metadata only:
        remote storage is read, never written, by this toolkit), "cache" (`cache_file_for`, found by lookups on
        this machine), or a local directory (to upload beside the metadata: `part-N.docs.idx`). One whose index
        there records the metadata's current size is kept unless `force`. `on_done(WrittenIndex)` after each."""
        out = []
        for m in metadata:
            if where == "beside":
                if is_remote(m):
                    raise DataError(
                        f"{m}: remote metadata: its index cannot be written beside it (remote storage is only read); "
                        "write it to a directory and upload it (--out DIR), or into the local cache (--cache)"
                    )
                target = Path(index_path_for(m))
            elif where == "cache":
                target = self.cache_file_for(m)
            else:
                target = Path(where) / index_path_for(m).rsplit("/", 1)[-1]
            size = self._metadata_size(m)
            if size is None:
                raise DataError(f"{m}: metadata file not found")
            existing = open_indexes({str(target): (target.stat().st_size, None)}, self.root) if target.is_file() else {}
            old = existing.get(str(target))
            if not force and isinstance(old, RangeFileIndex) and old.head.metadata_size == size:
                done = WrittenIndex(m, str(target), old.documents, old.head.file_size, True)
            else:
                head = write_index_file(m, target, sample_every, scratch=str(self.root))
                done = WrittenIndex(m, str(target), head.documents, head.file_size, False)
            with self._lock:
                self._ranged.pop(m, None)
            out.append(done)
            if on_done is not None:
                on_done(done)
        return out


def _probe(urls: list[str]) -> tuple[dict[str, tuple[int, str | None]], dict[str, bytes]]:
    """(size, ETag) of the remote index files that are there, and the first bytes of those that had to be asked:
    one ranged GET each gives both (`olmo_data.remote.starts`), kept where a HEAD's answer would be, so an
    absence is believed for `olmo_data.remote.sizes.ABSENT_TTL_S`, a day (an index uploaded later is seen after
    that, or at once once `<cache>/remote-sizes` is deleted)."""
    if not urls:
        return {}, {}
    stats, starts = remote_stats_and_starts(urls, HEAD_GUESS)
    found = {u: (st.size, st.etag) for u, st in stats.items() if st.size}
    return found, {u: data for u, data in starts.items() if u in found}


def check_rows_within(index: Index, metadata: str, token_path: str, num_tokens: int) -> None:
    """Refuse a metadata file with a row ending past its token file's last token, naming the row (1-based)."""
    past = index.first_row_past(num_tokens)
    if past is not None:
        row, end = past
        raise DataError(
            f"{metadata}: row {row + 1} ends at token {end}, past the end of its token file "
            f"{token_path} ({num_tokens} tokens); the metadata does not belong to these tokens or is damaged: "
            "re-run tokenize"
        )


def build_doc_index(metadata: str, directory: Path) -> None:
    """Index a `.csv.gz` metadata file (rows `start,end,id,src,loc`) into `directory`, atomically."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    c = read_metadata(metadata, directory.parent)  # a remote file is downloaded first, in retried ranged chunks
    spans = np.empty((len(c.starts), 5), dtype=np.int64, order="F")
    spans[:, 0], spans[:, 1], spans[:, 2], spans[:, 3], spans[:, 4] = (
        c.starts,
        c.ends,
        c.locs,
        c.src_codes,
        c.id_offsets,
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}.", dir=directory.parent))
    try:
        np.save(tmp / "spans.npy", spans)
        (tmp / "ids.bin").write_bytes(c.ids)
        info = {"metadata": metadata, "documents": len(c.starts), "id_bytes": len(c.ids), "sources": c.sources}
        (tmp / INDEX_JSON).write_text(json.dumps(info) + "\n")
        try:
            os.replace(tmp, directory)
        except OSError:  # another process built it first: keep theirs
            if not (directory / INDEX_JSON).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
