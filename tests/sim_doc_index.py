"""The simulated store's range-readable document indexes (`part-N.docs.idx`), computed from the generator.

Why: at OLMo 3's scale the metadata beside the token files is 280 GB of `.csv.gz`; a command that finds a
batch's documents from it would download whole files. The toolkit answers from the compact index that
`olmo-data index-documents` writes once beside each metadata file and then reads by byte ranges. This module
serves those index files as if that had been done, every byte computed from the simulation's functions
(`sim_store`), so `trace --document` and `inspect-batch` meet them at 6e12 tokens.

The layout is written out here from the format's description (olmo_data/dataset/doc_index_file.py's docstring),
not taken from the toolkit's code: a test compares these bytes with what `encode_index` builds from the served
metadata, so a slip on either side shows. One field differs on purpose: the sha256 of the metadata file is zeros
(hashing 280 GB of generated metadata is beyond the simulation; no reader checks it: readers compare the size).

Most of an index is O(1) a byte range (rows, ids: fixed-width, from `document_bounds`), but two sections need
every document of the file: the id hashes, sorted (their every 1,024th is in the head), and the distinct lengths
(their count sets the later offsets). `DocIndexes` computes them once per file (~0.5 s for 730K documents, almost
all of it blake2b called per id) and keeps them in memory, or in `cache` (a folder: `.npy` files mapped on later
runs; `prepare` fills it for every file on several processes, as index-documents' one-time cost).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import threading
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tests.sim_store import SimSpec

MAGIC, VERSION, SAMPLE_EVERY = b"OLMODIDX", 1, 1024
HEADER = struct.Struct("<8sII12QqQ32sI12x")  # magic, version, header size, 12 counts and offsets, max end, ...
CRC_AT = HEADER.size - 16
ROW = np.dtype([("start", "<i8"), ("end", "<i8"), ("id", "<u8"), ("loc", "<i8"), ("src", "<u4")])
HASH = np.dtype([("hash", "<u8"), ("row", "<u4")])
LENGTH = np.dtype([("length", "<i8"), ("count", "<i8")])
ID_BYTES = 19  # sim-IIIII-JJJJJJJJJ
KEPT = 64  # files whose sorted hashes a server keeps in memory without a cache folder


def id_bytes(i: int, lo: int, hi: int) -> np.ndarray:
    """The ids of documents lo..hi of file i (`sim_store.document_id`), as rows of ID_BYTES bytes."""
    j = np.arange(lo, hi, dtype=np.int64)
    out = np.empty((len(j), ID_BYTES), np.uint8)
    out[:, :10] = np.frombuffer(f"sim-{i:05d}-".encode(), np.uint8)
    for p in range(9):
        out[:, ID_BYTES - 1 - p] = 48 + (j // 10**p) % 10
    return out


def _sorted_hashes(spec: SimSpec, i: int) -> np.ndarray:
    """File i's ids' blake2b-64 hashes (little-endian, as the format's `id_hash`) with their rows, sorted by hash
    (stable: equal hashes keep row order)."""
    from tests.sim_store import document_count

    n = document_count(spec, i)
    blob = id_bytes(i, 0, n).tobytes()
    b2 = hashlib.blake2b
    digests = b"".join([b2(blob[o : o + ID_BYTES], digest_size=8).digest() for o in range(0, len(blob), ID_BYTES)])
    values = np.frombuffer(digests, "<u8")
    order = np.argsort(values, kind="stable")
    out = np.empty(n, HASH)
    out["hash"], out["row"] = values[order], order
    return out


def _lengths(spec: SimSpec, i: int) -> np.ndarray:
    from tests.sim_store import documents

    starts, ends = documents(spec, i)
    values, counts = np.unique(ends - starts, return_counts=True)
    out = np.empty(len(values), LENGTH)
    out["length"], out["count"] = values, counts
    return out


class DocIndexes:
    """Each file's sorted hashes and distinct lengths, computed once (thread-safe: the server's handlers share it)."""

    def __init__(self, spec: SimSpec, cache: str | os.PathLike[str] | None = None) -> None:
        self.spec = spec
        s = spec  # what the documents depend on (not the metadata flag, the order, nor the bucket)
        self.folder = (
            None if cache is None else Path(cache) / f"{s.files}-{s.total_tokens}-{s.seed}-{s.doc_tokens}-{s.spread}"
        )
        self._kept: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._samples: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._busy: dict[int, threading.Lock] = {}

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(sorted hashes, lengths) of file i."""
        with self._lock:
            if i in self._kept:
                self._kept.move_to_end(i)
                return self._kept[i]
            busy = self._busy.setdefault(i, threading.Lock())
        with busy:  # one thread computes a file; the others asking for it wait for that
            with self._lock:
                if i in self._kept:
                    return self._kept[i]
            got = self._load(i) or self._make(i)
            with self._lock:
                self._kept[i] = got
                if self.folder is None and len(self._kept) > KEPT:
                    self._kept.popitem(last=False)
            return got

    def sample(self, i: int) -> np.ndarray:
        """Every SAMPLE_EVERY-th sorted hash of file i (its head's sample), kept in a small file of its own in the
        cache: a head served from the hashes file itself touched one page in three of it, and at 6T those files
        (29 GB) do not fit in this machine's page cache, so the store spent its time in disk reads."""
        with self._lock:
            if i in self._samples:
                return self._samples[i]
        path = None if self.folder is None else self.folder / f"part-{i:05d}.sample.npy"
        got = None
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                got = np.load(path)
        if got is None:
            got = np.ascontiguousarray(self.get(i)[0]["hash"][::SAMPLE_EVERY])
            if path is not None:
                np.save(f"{path}.tmp.npy", got)
                os.replace(f"{path}.tmp.npy", path)
        with self._lock:
            self._samples[i] = got
        return got

    def _paths(self, i: int) -> tuple[Path, Path]:
        assert self.folder is not None
        return self.folder / f"part-{i:05d}.hashes.npy", self.folder / f"part-{i:05d}.lengths.npy"

    def _load(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        if self.folder is None:
            return None
        hashes, lengths = self._paths(i)
        try:
            return np.load(hashes, mmap_mode="r"), np.load(lengths)
        except (OSError, ValueError):
            return None

    def _make(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        got = _sorted_hashes(self.spec, i), _lengths(self.spec, i)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            for path, array in zip(self._paths(i), got, strict=True):
                np.save(f"{path}.tmp.npy", array)
                os.replace(f"{path}.tmp.npy", path)
        return got

    def prepare(self, processes: int = 2) -> int:
        """Compute every metadata file's hashes and lengths into the cache folder (those not there yet), on
        `processes` processes; returns how many were computed."""
        from tests.sim_store import has_metadata

        assert self.folder is not None, "prepare needs a cache folder"
        folder = self.folder
        todo = [
            i
            for i in range(self.spec.files)
            if has_metadata(self.spec, i)
            and (self._load(i) is None or not (folder / f"part-{i:05d}.sample.npy").is_file())
        ]
        if not todo:
            return 0
        import multiprocessing as mp

        global _PREPARING
        _PREPARING = self  # (inherited by the forked workers: a lock does not pickle)
        with mp.get_context("fork").Pool(processes) as pool:
            for done, _ in enumerate(pool.imap_unordered(_prepare_one, todo, chunksize=4), 1):
                if done % 100 == 0 or done == len(todo):
                    print(f"document indexes: {done}/{len(todo)} files", file=sys.stderr, flush=True)
        return len(todo)


_PREPARING: DocIndexes | None = None


def _prepare_one(i: int) -> int:
    assert _PREPARING is not None
    if _PREPARING._load(i) is None:
        _PREPARING._make(i)
    _PREPARING.sample(i)
    return i


def _sources(i: int) -> bytes:
    from tests.sim_store import _source

    return json.dumps([_source(i)], ensure_ascii=False).encode()


def layout(spec: SimSpec, i: int, indexes: DocIndexes) -> dict[str, int]:
    """The offsets and sizes of file i's index (the header's numbers)."""
    from tests.sim_store import document_count

    n = document_count(spec, i)
    m = len(indexes.get(i)[1])
    sources_off = HEADER.size + 24 * -(-n // SAMPLE_EVERY)
    head_size = sources_off + len(_sources(i))
    spans = -(-head_size // 8) * 8
    hashes = spans + n * ROW.itemsize
    lengths = hashes + n * HASH.itemsize
    ids = lengths + m * LENGTH.itemsize
    return {
        "n": n, "m": m, "sources": sources_off, "head": head_size, "spans": spans, "hashes": hashes,
        "lengths": lengths, "ids": ids, "size": ids + n * ID_BYTES,
    }  # fmt: skip


def index_size(spec: SimSpec, i: int, indexes: DocIndexes) -> int:
    return layout(spec, i, indexes)["size"]


def _head(spec: SimSpec, i: int, indexes: DocIndexes, at: dict[str, int]) -> bytes:
    from tests.sim_store import document_bounds, gz_size, token_counts

    n, k = at["n"], SAMPLE_EVERY
    starts, ends = document_bounds(spec, i, np.arange(0, n, k))
    hashes = indexes.sample(i)
    sample = np.concatenate([starts, ends, hashes.view(np.int64)]).astype("<i8").tobytes()
    sources = _sources(i)
    header = bytearray(HEADER.pack(
        MAGIC, VERSION, HEADER.size, n, k, n * ID_BYTES, at["m"], at["head"], at["sources"], len(sources),
        at["spans"], at["hashes"], at["lengths"], at["ids"], at["size"], int(token_counts(spec)[i]),
        gz_size(spec, i), bytes(32), 0,
    ))  # fmt: skip
    header[CRC_AT : CRC_AT + 4] = struct.pack("<I", zlib.crc32(bytes(header) + sample + sources))
    return bytes(header) + sample + sources + bytes(at["spans"] - at["head"])


def _rows(spec: SimSpec, i: int, lo: int, hi: int) -> bytes:
    from tests.sim_store import document_bounds

    j = np.arange(lo, hi, dtype=np.int64)
    rows = np.zeros(len(j), ROW)
    rows["start"], rows["end"] = document_bounds(spec, i, j)
    rows["id"], rows["loc"] = j * ID_BYTES, j + 1
    return rows.tobytes()


def index_bytes(spec: SimSpec, i: int, start: int, stop: int, indexes: DocIndexes) -> bytes:
    """Bytes start..stop of file i's index: each section's rows that the range touches, computed, then cut."""
    at = layout(spec, i, indexes)
    stop = min(stop, at["size"])
    hashes, lengths = indexes.get(i)
    sections = [  # (offset, record size, records lo..hi as bytes)
        (0, at["spans"], lambda lo, hi: _head(spec, i, indexes, at)),
        (at["spans"], ROW.itemsize, lambda lo, hi: _rows(spec, i, lo, hi)),
        (at["hashes"], HASH.itemsize, lambda lo, hi: np.asarray(hashes[lo:hi]).tobytes()),
        (at["lengths"], LENGTH.itemsize, lambda lo, hi: lengths[lo:hi].tobytes()),
        (at["ids"], ID_BYTES, lambda lo, hi: id_bytes(i, lo, hi).tobytes()),
    ]
    ends = [s[0] for s in sections[1:]] + [at["size"]]
    out = []
    for (offset, size, records), end in zip(sections, ends, strict=True):
        a, b = max(start, offset), min(stop, end)
        if a >= b:
            continue
        lo, hi = (a - offset) // size, -(-(b - offset) // size)
        out.append(records(lo, hi)[a - offset - lo * size : b - offset - lo * size])
    return b"".join(out)
