"""The range-readable document index: one file per tokenize metadata file, read by byte ranges, never whole.

Why: a token file's documents come from its `.csv.gz` metadata (rows `start,end,id,src,loc`), which has to be
downloaded and parsed whole before any lookup. At OLMo 3's scale (1.5M documents, tens of MB per metadata file) a
batch touching 500 token files would download gigabytes. This file (`part-N.docs.idx`, written once beside the
metadata by `olmo-data index-documents`, or into the local cache) answers "the documents of tokens [a, b)" with
two ranged reads after a small head that is read once and cached: one block of rows, then those rows' ids.

Layout (little-endian; offsets in bytes from the file's start):

* header (`HEADER`, 176 bytes): magic `OLMODIDX`, format version, header size, documents `n`, sample step `K`,
  id bytes, distinct document lengths `m`, head size, the offsets of the sources, rows, hashes, lengths and ids
  sections, the file's own size (a truncated copy is refused), the last row's end, the metadata file's size and
  sha256 (what it was built from: a reader compares the size with the metadata's), and the crc32 of the head.
* the sample (`ceil(n / K)` entries each): every K-th row's start (int64), every K-th row's end (int64), every
  K-th entry of the sorted id hashes (uint64). 24 bytes per 1,024 documents: 35 KB for 1.5M documents.
* the sources: a JSON array of the `src` names; a row's source is its index in it.
  Header, sample and sources are the *head*: a reader reads it first (one ranged read of `head_size` bytes),
  checks its crc and keeps it (it is immutable; `doc_index_ranges` caches it on disk).
* rows (`ROW`, 36 bytes each, in metadata order): start, end (int64), id offset (uint64, into the ids section),
  loc (int64, the 1-based line in `src`), source code (uint32).
* hashes (`HASH`, 12 bytes each, sorted): `id_hash(id)` (uint64) and its row (uint32): finding a document by id
  is one block of hashes and the candidate rows, not a scan of every id.
* lengths (`LENGTH`, 16 bytes each, ascending): each distinct document length (end - start) and how many
  documents have it: exact length statistics without reading the rows.
* ids: the ids' UTF-8 bytes back to back (row k's id ends where row k+1's starts; the last one at the end).

Finding the documents of tokens [a, b), as `numpy.searchsorted` does on the whole columns (first = the first
row whose end > a, last = the first row whose start >= b): the sampled ends and starts say which block of K rows
holds each answer (`blocks_for`); one ranged read of those rows (plus the next one, whose id offset ends the last
id) gives first and last, and one read of the ids section gives their ids. The index needs documents in token
order: starts and ends both ascending (tokenize writes them so; a file with overlapping documents is refused).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from olmo_data.errors import DataError
from olmo_data.io import atomic_path, local_copy, open_file

MAGIC = b"OLMODIDX"
VERSION = 1
SAMPLE_EVERY = 1024  # K: 24 bytes of head and a 36 KiB block of rows per K documents
SUFFIX = ".docs.idx"
HEADER = struct.Struct("<8sII" + "Q" * 12 + "q" + "Q" + "32s" + "I" + "12x")  # 176 bytes
ROW = np.dtype([("start", "<i8"), ("end", "<i8"), ("id", "<u8"), ("loc", "<i8"), ("src", "<u4")])
HASH = np.dtype([("hash", "<u8"), ("row", "<u4")])
LENGTH = np.dtype([("length", "<i8"), ("count", "<i8")])
CRC_AT = HEADER.size - 12 - 4  # where the head's crc32 lives in the header


def index_path_for(metadata: str) -> str:
    """The index's name beside a metadata file: `part-3.csv.gz` -> `part-3.docs.idx` (another name: + SUFFIX)."""
    return (metadata[: -len(".csv.gz")] if metadata.endswith(".csv.gz") else metadata) + SUFFIX


def id_hash(doc_id: bytes) -> int:
    """The 64-bit hash the hashes section sorts by: blake2b with an 8-byte digest, read little-endian."""
    return int.from_bytes(hashlib.blake2b(doc_id, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Head:
    """What a reader keeps of an index file: its header's numbers, the sample and the sources."""

    location: str
    documents: int
    sample_every: int
    id_bytes: int
    distinct_lengths: int
    head_size: int
    spans_offset: int
    hashes_offset: int
    lengths_offset: int
    ids_offset: int
    file_size: int
    max_end: int
    metadata_size: int
    metadata_sha256: str
    sample_starts: np.ndarray
    sample_ends: np.ndarray
    sample_hashes: np.ndarray
    sources: list[str]

    @property
    def blocks(self) -> int:
        return len(self.sample_starts)

    def block_rows(self, block: int) -> tuple[int, int]:
        """Rows [lo, hi) a read of `block` brings: its K rows and the next one (whose id offset ends the last)."""
        lo = block * self.sample_every
        return lo, min(self.documents, lo + self.sample_every + 1)

    def blocks_for(self, start: int, end: int) -> tuple[int, int]:
        """The blocks [lo, hi] (inclusive) whose rows decide which documents overlap tokens [start, end)."""
        ie = int(np.searchsorted(self.sample_ends, start, side="right"))  # samples with end <= start
        ib = int(np.searchsorted(self.sample_starts, end, side="left"))  # samples with start < end
        lo, hi = max(ie - 1, 0), max(ib - 1, 0)
        return lo, max(lo, hi)

    def block_for_end(self, value: int) -> int:
        """The block holding the first row whose end is > value (a row past a token file's end)."""
        return max(int(np.searchsorted(self.sample_ends, value, side="right")) - 1, 0)

    def hash_block(self, h: int) -> int:
        """The block of the hashes section holding the first entry >= h."""
        return max(int(np.searchsorted(self.sample_hashes, np.uint64(h), side="left")) - 1, 0)


def head_size_of(first: bytes, location: str) -> int:
    """The head's size, from a read of at least the header's bytes."""
    if len(first) < HEADER.size or first[:8] != MAGIC:
        raise DataError(
            f"{location}: not a document index file (no {MAGIC.decode()} header); rebuild it with "
            "`olmo-data index-documents`"
        )
    fields = HEADER.unpack_from(first)
    if fields[1] != VERSION:
        raise DataError(
            f"{location}: document index format version {fields[1]}, this olmo-data reads version "
            f"{VERSION}; rebuild it with `olmo-data index-documents --force`"
        )
    return int(fields[7])


def parse_head(data: bytes, location: str) -> Head:
    """The head of an index file from its first `head_size` (or more) bytes, checked (magic, version, crc)."""
    size = head_size_of(data, location)
    if len(data) < size:
        raise DataError(f"{location}: document index head cut short ({len(data)} of {size} bytes)")
    head = bytearray(data[:size])
    f = HEADER.unpack_from(head)
    (_, _, header_size, n, k, id_bytes, m, head_size, sources_off, sources_size, spans_off, hashes_off,
     lengths_off, ids_off, file_size, max_end, meta_size, meta_sha, crc) = f  # fmt: skip
    head[CRC_AT : CRC_AT + 4] = b"\0\0\0\0"
    if zlib.crc32(head) != crc or header_size != HEADER.size or k < 1:
        raise DataError(
            f"{location}: document index head damaged (checksum); rebuild it with "
            "`olmo-data index-documents --force`, or delete the cached copy"
        )
    nb = -(-n // k)
    sample = np.frombuffer(bytes(head[HEADER.size : HEADER.size + 24 * nb]), dtype="<i8")
    try:
        sources = json.loads(bytes(head[sources_off : sources_off + sources_size]))
    except ValueError as e:
        raise DataError(f"{location}: document index sources unreadable ({e}); rebuild it") from e
    return Head(
        location, n, k, id_bytes, m, head_size, spans_off, hashes_off, lengths_off, ids_off, file_size, max_end,
        meta_size, meta_sha.hex(), sample[:nb].copy(), sample[nb : 2 * nb].copy(),
        sample[2 * nb :].view("<u8").copy(), [str(s) for s in sources],
    )  # fmt: skip


@dataclass(frozen=True)
class MetadataColumns:
    """A metadata file's rows as columns, and what identifies the file (size and sha256 of its bytes)."""

    starts: np.ndarray  # int64
    ends: np.ndarray
    locs: np.ndarray
    src_codes: np.ndarray  # int32, into `sources`
    sources: list[str]
    id_offsets: np.ndarray  # int64, into `ids`
    ids: bytes
    size: int
    sha256: str


def read_metadata(metadata: str, scratch: str | os.PathLike[str]) -> MetadataColumns:
    """Parse a `.csv.gz` metadata file (rows `start,end,id,src,loc`; remote: downloaded into `scratch` first, in
    retried ranged chunks) into columns; rows out of token order are refused naming the file."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ["start", "end", "id", "src", "loc"]
    types = {"start": pa.int64(), "end": pa.int64(), "id": pa.string(), "src": pa.string(), "loc": pa.int64()}
    try:
        with local_copy(metadata, scratch) as local:
            size, sha = os.path.getsize(local), _sha256(local)
            with open_file(local, "rb") as f:  # gunzipped by name
                try:
                    table = pacsv.read_csv(
                        f,
                        read_options=pacsv.ReadOptions(column_names=names),
                        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
                    )
                except pa.ArrowInvalid as e:  # no rows at all: a token file without documents
                    if "Empty CSV" not in str(e):
                        raise
                    table = pa.table({k: pa.array([], type=t) for k, t in types.items()})
    except (pa.ArrowInvalid, ValueError, EOFError, gzip.BadGzipFile) as e:  # (a damaged gzip stream too)
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
    ids = table.column("id").combine_chunks().cast(pa.large_string())  # int64 offsets: any size
    buffers = ids.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[ids.offset : ids.offset + len(ids) + 1] if len(ids) else None
    blob = b"" if offsets is None else bytes(buffers[2])[int(offsets[0]) : int(offsets[-1])]
    id_offsets = np.zeros(0, np.int64) if offsets is None else (offsets[:-1] - offsets[0]).astype(np.int64)
    locs = table.column("loc").to_numpy().astype(np.int64)
    return MetadataColumns(starts, ends, locs, src_codes, sources, id_offsets, blob, size, sha)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def encode_index(columns: MetadataColumns, metadata: str, sample_every: int = SAMPLE_EVERY) -> list[bytes]:
    """The bytes of the index file of these columns, in order (their concatenation is the file). Refuses
    documents whose ends are not ascending (overlapping documents: the sampled search needs both columns sorted)."""
    c, k = columns, sample_every
    if k < 1:
        raise DataError(f"sample step {k}: must be at least 1 (every K-th document start is sampled)")
    n = len(c.starts)
    if n and np.any(np.diff(c.ends) < 0):
        row = int(np.flatnonzero(np.diff(c.ends) < 0)[0]) + 1
        raise DataError(
            f"{metadata}: row {row + 1} ends at token {int(c.ends[row])}, before row {row}'s end {int(c.ends[row - 1])}"
            ": documents overlap, which a range-readable index cannot search; lookups use the built index instead"
        )
    if n >= 2**32:
        raise DataError(f"{metadata}: {n} documents, more than a document index file holds (2**32 - 1)")
    rows = np.empty(n, dtype=ROW)
    rows["start"], rows["end"], rows["id"], rows["loc"], rows["src"] = (
        c.starts, c.ends, c.id_offsets, c.locs, c.src_codes
    )  # fmt: skip
    id_ends = np.append(c.id_offsets[1:], len(c.ids)) if n else c.id_offsets
    hashes = np.empty(n, dtype=HASH)
    hashes["hash"] = np.fromiter(
        (id_hash(c.ids[a:b]) for a, b in zip(c.id_offsets.tolist(), id_ends.tolist(), strict=True)),
        dtype=np.uint64, count=n,
    )  # fmt: skip
    hashes["row"] = np.arange(n, dtype=np.uint32)
    hashes = hashes[np.argsort(hashes["hash"], kind="stable")]
    values, counts = np.unique(c.ends - c.starts, return_counts=True)
    lengths = np.empty(len(values), dtype=LENGTH)
    lengths["length"], lengths["count"] = values, counts
    sample = np.concatenate([c.starts[::k], c.ends[::k], hashes["hash"][::k].astype(np.uint64).view(np.int64)]).astype(
        "<i8"
    )
    sources = json.dumps(c.sources, ensure_ascii=False).encode()
    sources_off = HEADER.size + sample.nbytes
    head_size = sources_off + len(sources)
    spans_off = _align(head_size)
    hashes_off = spans_off + rows.nbytes
    lengths_off = hashes_off + hashes.nbytes
    ids_off = lengths_off + lengths.nbytes
    file_size = ids_off + len(c.ids)
    header = bytearray(HEADER.pack(
        MAGIC, VERSION, HEADER.size, n, k, len(c.ids), len(lengths), head_size, sources_off, len(sources),
        spans_off, hashes_off, lengths_off, ids_off, file_size, int(c.ends[-1]) if n else 0, c.size,
        bytes.fromhex(c.sha256), 0,
    ))  # fmt: skip
    crc = zlib.crc32(bytes(header) + sample.tobytes() + sources)
    header[CRC_AT : CRC_AT + 4] = struct.pack("<I", crc)
    pad = b"\0" * (spans_off - head_size)
    return [bytes(header), sample.tobytes(), sources, pad, rows.tobytes(), hashes.tobytes(), lengths.tobytes(), c.ids]


def _align(offset: int, to: int = 8) -> int:
    return -(-offset // to) * to


def write_index_file(
    metadata: str, target: str | os.PathLike[str], sample_every: int = SAMPLE_EVERY, scratch: str | None = None
) -> Head:
    """Build the index of `metadata` (local or remote) and write it to the local path `target`, atomically (a
    temporary renamed into place: never half a file under its name). Returns its head."""
    target = Path(target)
    columns = read_metadata(metadata, scratch or target.parent)
    parts = encode_index(columns, metadata, sample_every)
    with atomic_path(target) as tmp, open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
    return parse_head(b"".join(parts[:3]), str(target))
