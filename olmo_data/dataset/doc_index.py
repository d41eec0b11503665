"""The document side index: which documents a run of tokens of a token file holds, from the tokenize metadata.

The metadata of a token file (`part-*.csv.gz`, rows `start,end,id,src,loc`) is indexed once per file (`DocIndex`):
sorted document starts and ends as `.npy` arrays plus the ids and sources, in a cache directory. A lookup is two
binary searches on memory maps, so inspecting a batch, counting documents or tracing one never scans a CSV,
whatever the dataset size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from olmo_data.dataset.manifest import Manifests
from olmo_data.errors import DataError
from olmo_data.io import default_cache_dir, file_sizes, is_remote, local_copy, open_file

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


class DocIndex:
    """Document lookups by token offset, from per-file side indexes built once from the tokenize metadata.

    The index of a metadata file lives in `cache_dir/docindex/<digest>/`, where the digest covers the metadata
    file's location, size and modification time: a rewritten metadata file gets a new index, never a stale
    one. Building is atomic (a temporary directory renamed into place), so concurrent users cannot see half an
    index.
    """

    def __init__(self, cache_dir: str | None = None) -> None:
        self.root = Path(cache_dir or default_cache_dir()) / "docindex"
        self._files: dict[str, FileIndex | None] = {}
        self._sizes: dict[str, int | None] = {}  # remote metadata files' sizes (part of their index's key)
        self._manifests = Manifests()  # token directories' manifests, each read once
        self._lock = threading.Lock()
        self.built = 0  # how many indexes this object had to build (tests check that lookups reuse them)

    def prepare(self, files: Iterable[tuple[str, str | None]]) -> None:
        """Get ready to look up these (token file, metadata) pairs, doing at once what one lookup after another
        would do in turn: ask for the sizes of the remote metadata files (each index's key needs one: a HEAD
        request), and build the indexes not built yet (each a download and a parse). A batch touches up to
        hundreds of files; in turn, each would cost network round trips."""
        with self._lock:  # (a file without a known metadata path: the one beside it, if any)
            named = [(t, m or metadata_path_for(t, self._manifests)) for t, m in files if t not in self._files]
            todo = {m for _, m in named if m}
            urls = sorted({m for m in todo if is_remote(m)} - set(self._sizes))
        if urls:  # concurrently, cached on disk; a remote .csv.gz that is not there (404): no documents
            sizes = file_sizes(urls, missing_ok=True)
            with self._lock:
                self._sizes.update(zip(urls, sizes, strict=True))
        with self._lock:
            todo = {m for m in todo if not is_remote(m) or self._sizes.get(m) is not None}  # (absent: no index)
            missing = {m: d for m in sorted(todo) if not ((d := self.root / self._key(m)) / INDEX_JSON).exists()}
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(build_doc_index, missing, missing.values()))
            with self._lock:
                self.built += len(missing)

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

    def index_for(
        self, token_path: str, metadata: str | None = None, num_tokens: int | None = None
    ) -> FileIndex | None:
        """The side index of a token file, building it on first use; None when the file has no metadata.

        `metadata` is the file's `.csv.gz` when known (`TokenFile.metadata_path`, from the manifest); else it is
        looked up beside the token file. With `num_tokens` (the token file's length) every row must end within
        the file: a row running past it would attribute every later instance to that one document.
        """
        with self._lock:
            if token_path in self._files:
                return self._files[token_path]
            metadata = metadata or metadata_path_for(token_path, self._manifests)
            index = None
            if metadata is not None and metadata == dolma_metadata(token_path) and self._absent(metadata):
                metadata = None  # dolma's .csv.gz absent remotely (404): no documents, as a local file without one
            if metadata is not None:
                directory = self.root / self._key(metadata)
                if not (directory / INDEX_JSON).exists():
                    build_doc_index(metadata, directory)
                    self.built += 1
                index = FileIndex(directory)
                if num_tokens is not None:
                    check_rows_within(index, metadata, token_path, num_tokens)
            self._files[token_path] = index
            return index

    def lookup(
        self, token_path: str, start: int, end: int, metadata: str | None = None, num_tokens: int | None = None
    ) -> list[DocumentSpan] | None:
        """The documents overlapping tokens [start, end) of a token file, in order; None without metadata."""
        index = self.index_for(token_path, metadata, num_tokens)
        if index is None:
            return None
        first = int(np.searchsorted(index.ends, start, side="right"))  # first document ending after `start`
        last = int(np.searchsorted(index.starts, end, side="left"))  # documents starting before `end`
        out = []
        for k in range(first, last):
            doc_id, src, loc, d_start, d_end = index.doc(k)
            lo = max(d_start, start)
            out.append(
                DocumentSpan(doc_id, src, loc, d_start, d_end, lo - start, min(d_end, end) - start, lo - d_start)
            )
        return out


def check_rows_within(index: FileIndex, metadata: str, token_path: str, num_tokens: int) -> None:
    """Refuse a metadata file with a row ending past its token file's last token, naming the row (1-based)."""
    past = np.flatnonzero(np.asarray(index.ends) > num_tokens)
    if len(past):
        row = int(past[0])
        raise DataError(
            f"{metadata}: row {row + 1} ends at token {int(index.ends[row])}, past the end of its token file "
            f"{token_path} ({num_tokens} tokens); the metadata does not belong to these tokens or is damaged: "
            "re-run tokenize"
        )


def build_doc_index(metadata: str, directory: Path) -> None:
    """Index a `.csv.gz` metadata file (rows `start,end,id,src,loc`) into `directory`, atomically."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ["start", "end", "id", "src", "loc"]
    types = {"start": pa.int64(), "end": pa.int64(), "id": pa.string(), "src": pa.string(), "loc": pa.int64()}
    try:  # a remote file is downloaded first, in retried ranged chunks: a reset midway costs one chunk
        with local_copy(metadata, directory.parent) as local, open_file(local, "rb") as f:  # gunzipped by name
            table = pacsv.read_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=names),
                convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
            )
    except (pa.ArrowInvalid, ValueError) as e:
        raise DataError(f"{metadata}: not a metadata file of rows start,end,id,src,loc ({e})") from e
    starts = table.column("start").to_numpy().astype(np.int64)
    ends = table.column("end").to_numpy().astype(np.int64)
    if len(starts) and (np.any(np.diff(starts) < 0) or np.any(ends < starts)):
        raise DataError(
            f"{metadata}: document rows are not in token order (start ascending, end >= start); "
            "the file is damaged: re-run tokenize"
        )
    src_dict = table.column("src").combine_chunks().dictionary_encode()
    sources = [str(s) for s in src_dict.dictionary.to_pylist()]
    src_codes = src_dict.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    ids = table.column("id").combine_chunks()
    id_bytes = [s.encode("utf-8") for s in ids.to_pylist()]
    id_offsets = np.zeros(len(id_bytes), dtype=np.int64)
    if len(id_bytes) > 1:
        np.cumsum([len(b) for b in id_bytes[:-1]], out=id_offsets[1:])
    spans = np.empty((len(starts), 5), dtype=np.int64, order="F")
    spans[:, 0], spans[:, 1] = starts, ends
    spans[:, 2] = table.column("loc").to_numpy().astype(np.int64)
    spans[:, 3], spans[:, 4] = src_codes, id_offsets
    blob = b"".join(id_bytes)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}.", dir=directory.parent))
    try:
        np.save(tmp / "spans.npy", spans)
        (tmp / "ids.bin").write_bytes(blob)
        info = {"metadata": metadata, "documents": len(starts), "id_bytes": len(blob), "sources": sources}
        (tmp / INDEX_JSON).write_text(json.dumps(info) + "\n")
        try:
            os.replace(tmp, directory)
        except OSError:  # another process built it first: keep theirs
            if not (directory / INDEX_JSON).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
