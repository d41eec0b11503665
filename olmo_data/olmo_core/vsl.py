"""OLMo-core's `NumpyVSLDataset`: documents cut into power-of-two pieces, each piece an instance of its length.

OLMo-core 3.0.0 finds a file's documents as for its other datasets (in a local file a document ends at every EOS,
tokens after the last one are no document; a remote file's come from the `.csv.gz` beside it) and cuts each, from
its first token, into pieces: as many of `max_sequence_length` as fit, then the binary digits of what is left,
longest first, down to `min_sequence_length` (the rest is dropped). Instances are those pieces, file after file;
the bucket of length L is every instance of L tokens, in instance order. A batch is one bucket's instances
(`olmo_data.olmo_core.vsl_curriculum`, `vsl_loader`), never padded, never masked.

Its dataset keeps what it found in its work_dir, and those files are read when they are there (each checked),
else rebuilt here byte for byte:

* `dataset-common/bucketed-doc-indices-{sha256 of path, size, bucket lengths}.npy`: uint32 start, end per piece;
* `dataset-{fingerprint}/instance-lengths.npy`: each instance's length, in the smallest unsigned type that holds
  `max_sequence_length - 1` (so a longest bucket of 256 or 65,536 tokens wraps to 0 there and is empty: OLMo-core
  then fails reading it, and such runs are refused);
* `dataset-{fingerprint}/bucket{L}-indices.npy`: uint32 instance numbers of the bucket.

The fingerprint is OLMo-core's dataset fingerprint (its class, tokenizer ids, dtype, bucket bounds, curriculum,
and each file's name and size).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from olmo_data.dataset import read_arrays
from olmo_data.errors import DataError
from olmo_data.olmo_core.cache_files import numpy_dataset_fingerprint
from olmo_data.olmo_core.config import NUMPY_DTYPES, OlmoCoreRun, local_path
from olmo_data.olmo_core.packed import document_bounds, metadata_bounds
from olmo_data.olmo_core.vsl_curriculum import VSLCurriculum, bucket_lengths

INDEX_DTYPE = np.dtype("<u4")  # OLMo-core's indices_dtype for VSL


def lengths_dtype(max_length: int) -> np.dtype:
    """OLMo-core's dtype for instance lengths: the smallest unsigned type holding `max_length - 1`."""
    for name in ("<u1", "<u2", "<u4", "<u8"):
        if max_length - 1 <= np.iinfo(np.dtype(name)).max:
            return np.dtype(name)
    raise DataError(f"max_sequence_length {max_length} is too large")


def bucket_pieces(docs: np.ndarray, min_length: int, max_length: int) -> np.ndarray:
    """(m, 2) start, end of every piece OLMo-core's `bucket_documents` cuts documents `docs` ((n, 2)) into, in
    its order: per document, whole pieces of max_length, then one piece per binary digit of the remainder from
    the highest, while the digit is at least min_length."""
    starts = docs[:, 0].astype(np.int64)
    n = np.maximum(docs[:, 1] - docs[:, 0], 0).astype(np.int64)
    full, rest = n // max_length, n % max_length
    owner = np.repeat(np.arange(len(docs)), full)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(full) - full, full)
    begin = [starts[owner] + within * max_length]
    size = [np.full(len(owner), max_length, dtype=np.int64)]
    bit = max_length // 2
    while bit >= min_length:
        has = (rest & bit) != 0
        begin.append(starts[has] + full[has] * max_length + (rest[has] & ~(2 * bit - 1)))
        size.append(np.full(int(has.sum()), bit, dtype=np.int64))
        bit //= 2
    a, s = np.concatenate(begin), np.concatenate(size)
    order = np.argsort(a, kind="stable")  # pieces of one file never share a start: this is OLMo-core's order
    return np.stack([a[order], a[order] + s[order]], axis=1)


def doc_indices_path(run: OlmoCoreRun, path: str, size_bytes: int) -> str:
    """Where OLMo-core keeps a file's pieces (`_get_document_indices_path`)."""
    digest = hashlib.sha256(str(path).encode() + str(size_bytes).encode())
    for length in bucket_lengths(int(run.min_sequence_length or 1), run.sequence_length):
        digest.update(str(length).encode())
    return os.path.join(run.dataset_work_dir, "dataset-common", f"bucketed-doc-indices-{digest.hexdigest()}.npy")


def vsl_fingerprint(run: OlmoCoreRun, paths: list[str], size_bytes: list[int]) -> str:
    """OLMo-core's `NumpyVSLDataset.fingerprint` (the folder its dataset and loader files go in)."""
    curriculum = run.curriculum or VSLCurriculum()
    values = [
        ("vocab_size", run.vocab_size),
        ("pad_token_id", run.pad_token_id),
        ("eos_token_id", run.eos_token_id),
        ("dtype", f"<class 'numpy.{run.dtype}'>"),
        ("min_sequence_length", run.min_sequence_length),
        ("max_sequence_length", run.sequence_length),
        ("curriculum", curriculum.class_repr),
    ]
    return numpy_dataset_fingerprint("NumpyVSLDataset", values, paths, size_bytes)


@dataclass
class VSLInstances:
    """The instances of an OLMo-core VSL run: per file its pieces, their lengths and buckets, and where each came
    from (`notes`)."""

    run: OlmoCoreRun
    paths: list[str]
    size_bytes: list[int]
    spans: list[np.ndarray]  # per file, (n, 2) int64 start, end of its instances
    stored_lengths: np.ndarray  # every instance's length as OLMo-core stores it (lengths_dtype)
    buckets: list[tuple[int, np.ndarray]]  # (length, uint32 instance numbers), shortest first
    fingerprint: str
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        counts = [len(s) for s in self.spans]
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def counts(self) -> list[int]:
        return [len(s) for s in self.spans]

    @property
    def instances_per_bucket(self) -> list[tuple[int, int]]:
        return [(length, len(b)) for length, b in self.buckets]

    def locate(self, indices: npt.ArrayLike) -> list[tuple[int, int, int]]:
        """(file, start, end) of each instance."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise DataError(f"instance {int(idx.max())} is out of range: OLMo-core's VSL dataset has {len(self)}")
        files = np.searchsorted(self.offsets, idx, side="right") - 1
        out = []
        for i, k in zip(idx.tolist(), files.tolist(), strict=True):
            start, end = (int(x) for x in self.spans[k][i - int(self.offsets[k])])
            out.append((k, start, end))
        return out

    def rows(self, indices: npt.ArrayLike) -> np.ndarray:
        """Token ids (int64, (n, L)) of instances of one bucket, as OLMo-core's collator stacks them."""
        where = self.locate(indices)
        lengths = {e - s for _, s, e in where}
        if len(lengths) > 1:
            raise DataError(f"instances of lengths {sorted(lengths)} in one batch: not one VSL bucket")
        dtype = NUMPY_DTYPES[self.run.dtype]
        arrays = read_arrays([(self.paths[k], dtype, s, e - s) for k, s, e in where])
        width = lengths.pop() if lengths else 0
        out = np.empty((len(where), width), dtype=np.int64)
        for row, a in enumerate(arrays):
            out[row] = a
        return out

    def holding(self, path: str, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(instance, first file token, tokens, 0) of every instance holding a token of tokens [start, end) of
        `path`, for `trace`: each piece of a document is one instance, from its first token."""
        out: list[tuple[int, int, int, int]] = []
        for k, p in enumerate(self.paths):
            if p != path:
                continue
            spans = self.spans[k]
            for j in np.flatnonzero((spans[:, 0] < end) & (spans[:, 1] > start)).tolist():
                out.append((int(self.offsets[k]) + j, int(spans[j, 0]), int(spans[j, 1] - spans[j, 0]), 0))
        return out

    def held_per_file(self) -> list[int]:
        """Tokens of each file that some instance holds (the rest: pieces below min_sequence_length, tails)."""
        return [int((s[:, 1] - s[:, 0]).sum()) for s in self.spans]


def open_vsl(run: OlmoCoreRun, paths: list[str], tokens: list[int], itemsize: int) -> VSLInstances:
    """The VSL dataset of a run: OLMo-core's files in its work_dir read (checked) where they are, else rebuilt."""
    lo, hi = int(run.min_sequence_length or 1), run.sequence_length
    sizes = [t * itemsize for t in tokens]
    spans, read, rebuilt = [], 0, 0
    for path, n, size in zip(paths, tokens, sizes, strict=True):
        stored = doc_indices_path(run, path, size)
        if os.path.isfile(stored):
            spans.append(_read_pieces(stored, path, n, lo, hi))
            read += 1
            continue
        docs = document_bounds(run, path, n) if local_path(path) else metadata_bounds(path, n, packing=False)
        pieces = bucket_pieces(docs, lo, hi)
        if not len(pieces):
            raise DataError(
                f"{path}: no document of at least dataset.min_sequence_length {lo:,} tokens; OLMo-core's VSL "
                "dataset fails on a file without any"
            )
        spans.append(pieces)
        rebuilt += 1
    common = os.path.join(run.dataset_work_dir, "dataset-common")
    notes = [_note("bucketed-doc-indices", read, rebuilt, common)]
    fingerprint = vsl_fingerprint(run, paths, sizes)
    folder = os.path.join(run.dataset_work_dir, f"dataset-{fingerprint}")
    all_spans = np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)
    stored_lengths = (all_spans[:, 1] - all_spans[:, 0]).astype(lengths_dtype(hi))  # wraps as OLMo-core's does
    lengths_file = os.path.join(folder, "instance-lengths.npy")
    has_lengths = int(os.path.isfile(lengths_file))
    if has_lengths:
        _check_same(lengths_file, stored_lengths, "instance lengths")
    notes.append(_note("instance-lengths", has_lengths, 1 - has_lengths, folder))
    buckets, found = [], 0
    for length in bucket_lengths(lo, hi):
        members = np.flatnonzero(stored_lengths == length).astype(np.uint32)
        bucket_file = os.path.join(folder, f"bucket{length}-indices.npy")
        if os.path.isfile(bucket_file):
            _check_same(bucket_file, members, f"bucket {length}")
            found += 1
        if not len(members):
            wrapped = (
                f" (OLMo-core stores lengths as {lengths_dtype(hi).name}, where {hi:,} is 0)" if length == hi else ""
            )
            raise DataError(
                f"{run.source}: bucket {length:,} holds no instance{wrapped}; OLMo-core's VSL loader fails reading "
                "an empty bucket file: not covered"
            )
        buckets.append((length, members))
    notes.append(_note("bucket indices", found, len(buckets) - found, folder))
    return VSLInstances(run, paths, sizes, spans, stored_lengths, buckets, fingerprint, notes)


def _note(what: str, read: int, rebuilt: int, folder: str) -> str:
    if rebuilt == 0:
        return f"{what}: read from {folder}"
    if read == 0:
        return f"{what}: rebuilt (OLMo-core's files not found in {folder})"
    return f"{what}: {read} read from {folder}, {rebuilt} rebuilt"


def _read_pieces(stored: str, path: str, n_tokens: int, lo: int, hi: int) -> np.ndarray:
    """OLMo-core's pieces of `path`, checked before use: uint32 pairs within the file, each a bucket's length."""
    size = os.path.getsize(stored)
    if size % 8 or size == 0:
        raise DataError(
            f"{stored}: {size:,} bytes is not OLMo-core's bucketed document indices of {path} (uint32 start, end "
            "pairs); remove it to cut the documents again"
        )
    spans = np.fromfile(stored, dtype=INDEX_DTYPE).astype(np.int64).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    ok = (lengths >= lo) & (lengths <= hi) & ((lengths & (lengths - 1)) == 0) & (spans[:, 1] <= n_tokens)
    if not ok.all():
        bad = int(np.argmin(ok))
        raise DataError(
            f"{stored}: piece {bad:,} is tokens {spans[bad].tolist()}, not a power-of-two piece of {lo:,} to "
            f"{hi:,} of the {n_tokens:,} tokens of {path}; the file is damaged or another run's: remove it"
        )
    return spans


def _check_same(stored: str, want: np.ndarray, what: str) -> None:
    """An OLMo-core file of the dataset holds what its other files imply, byte for byte, else it is named."""
    data = np.fromfile(stored, dtype=want.dtype) if os.path.getsize(stored) % want.itemsize == 0 else None
    if data is None or len(data) != len(want) or not np.array_equal(data, want):
        raise DataError(
            f"{stored}: not the {what} OLMo-core derives from the run's bucketed document indices (damaged, or "
            "left by other data of the same names and sizes); remove the run's dataset-* folder to rebuild it"
        )


def dataset_files(vsl: VSLInstances, folder: str) -> list[tuple[str, bytes, str]]:
    """(path, bytes, what) of every file OLMo-core's VSL dataset writes, placed in `folder` as its work_dir."""
    run = vsl.run
    out = []
    for path, size, spans in zip(vsl.paths, vsl.size_bytes, vsl.spans, strict=True):
        name = os.path.basename(doc_indices_path(run, path, size))
        what = f"bucketed document indices of {path}"
        out.append((os.path.join(folder, "dataset-common", name), spans.astype(INDEX_DTYPE).tobytes(), what))
    own = os.path.join(folder, f"dataset-{vsl.fingerprint}")
    out.append((os.path.join(own, "instance-lengths.npy"), vsl.stored_lengths.tobytes(), "instance lengths"))
    for length, members in vsl.buckets:
        out.append(
            (
                os.path.join(own, f"bucket{length}-indices.npy"),
                members.astype(INDEX_DTYPE).tobytes(),
                f"bucket {length}",
            )
        )
    return out
