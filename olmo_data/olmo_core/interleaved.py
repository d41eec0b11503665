"""OLMo-core's `NumpyInterleavedFSLDataset`: chunks of several documents interleaved into one instance.

OLMo-core 3.0.0 builds it on its padded dataset (one document per entry: its first L tokens, documents found as
the padded dataset finds them) and then, with D = `docs_per_instance` and C = `chunks_per_doc`:

* the documents of the files named in `interleaving_exempt_paths` (compared with each dataset path as a string)
  stay whole: each is an instance of its own, numbered first, in dataset order, read as the padded dataset reads
  it. Every other document is interleavable: numpy's `Generator(PCG64(seed)).permutation` of their numbers (the
  dataset's `seed`, not the loader's), and instance j after the exempt ones is entries jD .. jD + D - 1 of it
  (the last `count % D` documents are in no instance).
* each of an instance's documents is cut to its first L / D tokens; its pad, EOS (and BOS, when the tokenizer has
  one) ids are removed wherever they are; what is left is split into C chunks (`tensor_split`: the first ones a
  token longer), and the instance is chunk 0 of every document in turn, then chunk 1 of each, and so on. Where it
  is shorter than L, a BOS is put first (with a BOS id), then an EOS after it where there is still room, then pad
  ids to L. The label mask is the documents' own (True, or their label mask file's) on their tokens, True on the
  added BOS and EOS, False on padding.
* its `instance_mask` (with an instance filter) is True only when every one of its documents passes the filter
  judged on the document's own tokens (at most L, before the cut to L / D and without padding).

OLMo-core keeps each file's documents in `work_dir/dataset-common/instance-indices-{L}-{sha256}.npy` (keyed by
the path, its size and D) and the permutation in `work_dir/dataset-{fingerprint}/interleavable-docs-indices.npy`
(uint32; `interleaving-exempt-docs-indices.npy` beside it with exempt paths), the fingerprint being its dataset's
(class, settings, file names and sizes). Those files are read when they are there, else rebuilt byte for byte;
`build-order` writes them under the same names.

This module imports nothing of the package at run time: `config` takes `Interleaving` and `read_interleaving`
from it, `dataset` gives it each file's documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from olmo_data.dataset import LABEL_MASK_DTYPE, read_arrays
from olmo_data.errors import DataError, shown
from olmo_data.olmo_core.cache_files import keep_or_write, numpy_dataset_fingerprint

if TYPE_CHECKING:
    from olmo_data.dataset import RepetitionFilter
    from olmo_data.olmo_core.config import OlmoCoreRun

INDEX_DTYPE = np.dtype("<u4")  # OLMo-core's padded and interleaved indices_dtype (np.uint32)
INTERLEAVABLE = "interleavable-docs-indices.npy"
EXEMPT = "interleaving-exempt-docs-indices.npy"
MAX_SEED = (1 << 63) - 1


@dataclass(frozen=True)
class Interleaving:
    """A NumpyInterleavedFSLDatasetConfig's own keys (see the module)."""

    docs_per_instance: int
    chunks_per_doc: int
    seed: int
    exempt_paths: tuple[str, ...] | None = None  # None and () differ in OLMo-core's fingerprint, so both are kept


def read_interleaving(dataset: dict[str, Any], sequence_length: int, where: str) -> Interleaving:
    """The interleaving keys of a NumpyInterleavedFSLDatasetConfig, checked as OLMo-core checks them."""
    counts = {}
    for key in ("docs_per_instance", "chunks_per_doc"):
        value = dataset.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= sequence_length:
            raise DataError(
                f"{where}: dataset.{key} is {shown(value)}; expected a whole number from 1 to the sequence length "
                f"{sequence_length}"
            )
        if sequence_length % value:
            raise DataError(
                f"{where}: dataset.{key} is {value}; OLMo-core needs dataset.sequence_length ({sequence_length}) "
                "to be a multiple of it"
            )
        counts[key] = value
    seed = dataset.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise DataError(f"{where}: dataset.seed is {shown(seed)}; expected a whole number from 0 (the interleaving's)")
    exempt = dataset.get("interleaving_exempt_paths")
    if exempt is not None and (not isinstance(exempt, list) or not all(isinstance(p, str) for p in exempt)):
        raise DataError(f"{where}: dataset.interleaving_exempt_paths is {shown(exempt)}; expected a list of paths")
    return Interleaving(
        counts["docs_per_instance"], counts["chunks_per_doc"], seed, tuple(exempt) if exempt is not None else None
    )


def dataset_fingerprint(run: OlmoCoreRun, paths: list[str], size_bytes: list[int]) -> str:
    """OLMo-core's `NumpyInterleavedFSLDataset.fingerprint`: its class, settings, file names and sizes."""
    spec = run.interleaving
    assert spec is not None
    exempt = None if spec.exempt_paths is None else list(spec.exempt_paths)
    fields = (
        ("vocab_size", run.vocab_size),
        ("pad_token_id", run.pad_token_id),
        ("eos_token_id", run.eos_token_id),
        ("dtype", f"<class 'numpy.{run.dtype}'>"),
        ("_docs_per_instance", spec.docs_per_instance),
        ("_seed", spec.seed),
        ("_interleaving_exempt_paths", exempt),
        ("max_target_sequence_length", None),
        ("bos_token_id", run.bos_token_id),
        ("sequence_length", run.sequence_length),
    )
    return numpy_dataset_fingerprint("NumpyInterleavedFSLDataset", fields, paths, size_bytes)


class InterleavedInstances:
    """The instances of an OLMo-core interleaved dataset, numbered as OLMo-core numbers them (see the module)."""

    def __init__(
        self,
        run: OlmoCoreRun,
        paths: list[str],
        documents: list[np.ndarray],
        order: np.ndarray,
        exempt: np.ndarray,
        folder: str,
        note: str,
        index_files: list[str],
    ) -> None:
        assert run.interleaving is not None
        self.run, self.paths, self.spec = run, paths, run.interleaving
        self.per_file = documents  # per file, (n, 2) start/end of its documents (each at most L), in the file
        counts = [len(d) for d in documents]
        self.doc_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.docs = np.concatenate(documents).astype(np.int64) if documents else np.zeros((0, 2), np.int64)
        self.doc_file = np.repeat(np.arange(len(paths)), counts)
        self.order = order  # OLMo-core's permutation of the interleavable documents' numbers
        self.exempt = exempt  # the exempt documents' numbers, in dataset order
        self.folder = folder  # work_dir/dataset-{fingerprint}: where OLMo-core keeps both
        self.note = note  # where they came from ("read from ..." or "rebuilt ...")
        self.index_files = index_files  # per file, where OLMo-core keeps its documents (instance-indices)
        self.mixed = len(order) // self.spec.docs_per_instance  # instances of interleaved documents
        self._instance_of: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.exempt) + self.mixed

    def docs_of(self, index: int) -> list[int]:
        """The documents instance `index` reads, in its order (one for an exempt instance)."""
        if not 0 <= index < len(self):
            raise DataError(f"instance {index} is out of range: OLMo-core's interleaved dataset has {len(self)}")
        if index < len(self.exempt):
            return [int(self.exempt[index])]
        d = self.spec.docs_per_instance
        j = index - len(self.exempt)
        return self.order[j * d : (j + 1) * d].astype(np.int64).tolist()

    def _read(self, docs: list[int], masks: tuple[str, ...] | None = None) -> list[np.ndarray]:
        """Each document's tokens (and then, with label mask files, each one's mask), at most L of them."""
        dtype = np.dtype(self.run.dtype)
        spans = [(int(self.doc_file[g]), int(self.docs[g, 0]), int(self.docs[g, 1])) for g in docs]
        reads: list[tuple[str, Any, int, int]] = [(self.paths[k], dtype, s, e - s) for k, s, e in spans]
        if masks is not None:
            reads += [(masks[k], LABEL_MASK_DTYPE, s, e - s) for k, s, e in spans]
        return read_arrays(reads)

    def _layout(self, tokens: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """For an interleaved instance of documents with these tokens: the document (0..D-1) and the offset in it
        of each token it takes, in instance order, and the position of the first (1 after an added BOS)."""
        run, spec = self.run, self.spec
        special = [run.pad_token_id, run.eos_token_id] + ([run.bos_token_id] if run.bos_token_id is not None else [])
        cut = run.sequence_length // spec.docs_per_instance
        chunks = [np.array_split(np.flatnonzero(~np.isin(t[:cut], special)), spec.chunks_per_doc) for t in tokens]
        which = [np.full(len(chunks[j][c]), j) for c in range(spec.chunks_per_doc) for j in range(len(tokens))]
        offsets = [chunks[j][c] for c in range(spec.chunks_per_doc) for j in range(len(tokens))]
        taken = np.concatenate(which).astype(np.int64), np.concatenate(offsets).astype(np.int64)
        lead = int(run.bos_token_id is not None and len(taken[0]) < run.sequence_length)
        return taken[0], taken[1], lead

    def rows(self, indices: npt.ArrayLike, masks: tuple[str, ...] | None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int64, (n, L)) and label masks of these instances, as OLMo-core's dataset gives them."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        run, L = self.run, self.run.sequence_length
        per = [self.docs_of(i) for i in idx]
        flat = [g for docs in per for g in docs]
        arrays = self._read(flat, masks)
        tokens = np.full((len(idx), L), run.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(idx), L), dtype=bool)
        at = 0
        for row, (index, docs) in enumerate(zip(idx, per, strict=True)):
            own = arrays[at : at + len(docs)]
            own_masks = arrays[len(flat) + at : len(flat) + at + len(docs)] if masks is not None else None
            at += len(docs)
            if index < len(self.exempt):  # a padded instance: the document, then padding
                n = len(own[0])
                tokens[row, :n] = own[0]
                mask[row, :n] = own_masks[0] if own_masks is not None else True
                continue
            which, offset, lead = self._layout(own)
            starts = np.concatenate([[0], np.cumsum([len(t) for t in own])]).astype(np.int64)
            taken = starts[which] + offset
            n = len(taken)
            tokens[row, lead : lead + n] = np.concatenate(own)[taken]
            mask[row, lead : lead + n] = np.concatenate(own_masks)[taken] if own_masks is not None else True
            if lead and run.bos_token_id is not None:
                tokens[row, 0], mask[row, 0] = run.bos_token_id, True
            if lead + n < L:
                tokens[row, lead + n], mask[row, lead + n] = run.eos_token_id, True
        over = np.flatnonzero((tokens >= run.vocab_size).any(axis=1))
        if len(over):
            k = int(self.doc_file[per[int(over[0])][0]])
            raise DataError(
                f"{self.paths[k]}: interleaved instance {idx[int(over[0])]} reads an id past "
                f"dataset.tokenizer.vocab_size {run.vocab_size:,} of {run.source}, which reads the file as "
                f"{run.dtype} ({run.dtype_from or 'dataset.dtype'}): the file holds another dtype, or the config "
                "names another tokenizer"
            )
        return tokens, mask

    def pieces(self, index: int) -> tuple[list[tuple[int, str, int, int]], list[int], int]:
        """(file index, path, start, end) of each run of file tokens instance `index` holds in a row, its position
        in the instance, and the instance's tokens before padding (an added BOS and EOS included)."""
        docs = self.docs_of(index)
        if index < len(self.exempt):
            k, (s, e) = int(self.doc_file[docs[0]]), self.docs[docs[0]].tolist()
            return [(k, self.paths[k], s, e)], [0], e - s
        which, offset, lead = self._layout(self._read(docs))
        ids = np.asarray(docs, dtype=np.int64)[which]
        files, places = self.doc_file[ids], self.docs[ids, 0] + offset
        breaks = np.flatnonzero((np.diff(places) != 1) | (np.diff(files) != 0)) + 1
        bounds = [0, *breaks.tolist(), len(places)] if len(places) else [0]
        out, at = [], []
        for a, b in zip(bounds, bounds[1:], strict=False):
            k = int(files[a])
            out.append((k, self.paths[k], int(places[a]), int(places[b - 1]) + 1))
            at.append(lead + a)
        n = lead + len(places)
        return out, at, min(n + 1, self.run.sequence_length)

    def instance_mask(self, indices: npt.ArrayLike, rule: RepetitionFilter) -> np.ndarray:
        """OLMo-core's `instance_mask`: True where every document of the instance passes the filter, each judged
        on its own tokens (at most L, unpadded)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        per = [self.docs_of(i) for i in idx]
        arrays = iter(self._read([g for docs in per for g in docs]))
        return np.array([all([not rule.filtered(next(arrays))[0] for _ in docs]) for docs in per], dtype=bool)

    def instance_of(self, doc: int) -> int:
        """The instance holding document `doc` (a number of the padded dataset's), -1 when none does."""
        if self._instance_of is None:
            where = np.full(len(self.docs), -1, dtype=np.int64)
            where[self.exempt] = np.arange(len(self.exempt))
            used = self.mixed * self.spec.docs_per_instance
            where[self.order[:used]] = len(self.exempt) + np.arange(used) // self.spec.docs_per_instance
            self._instance_of = where
        return int(self._instance_of[doc])

    def holding(self, path: str, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(instance, first file token, tokens, position in the instance) of every run of tokens [start, end) of
        `path` an instance holds in a row (a document's C chunks are C runs, or more where ids were removed)."""
        instances: set[int] = set()
        files = [k for k, p in enumerate(self.paths) if p == path]
        for k in files:
            lo, hi = int(self.doc_offsets[k]), int(self.doc_offsets[k + 1])
            spans = self.docs[lo:hi]
            for g in (np.flatnonzero((spans[:, 0] < end) & (spans[:, 1] > start)) + lo).tolist():
                if self.instance_of(g) >= 0:
                    instances.add(self.instance_of(g))
        out = []
        for instance in sorted(instances):
            found, at, _ = self.pieces(instance)
            for (k, _, s, e), a in zip(found, at, strict=True):
                if k in files and s < end and e > start:
                    out.append((instance, s, e - s, a))
        return sorted(out)

    def first_files(self) -> np.ndarray:
        """Per instance, the dataset's index of the file its first document is in (`stats` counts by it)."""
        d = self.spec.docs_per_instance
        firsts = np.concatenate([self.exempt, self.order[: self.mixed * d : d]])
        return self.doc_file[firsts.astype(np.int64)].astype(np.int64)

    def held_per_file(self) -> list[int]:
        """Tokens of each file some instance reads: an exempt document's (at most L), an interleaved one's first
        L / D (its pad, EOS and BOS ids among them, which the instance drops); none of a document left over."""
        lengths = self.docs[:, 1] - self.docs[:, 0]
        read = np.zeros(len(self.docs), dtype=np.int64)
        read[self.exempt] = lengths[self.exempt]
        used = self.order[: self.mixed * self.spec.docs_per_instance].astype(np.int64)
        read[used] = np.minimum(lengths[used], self.run.sequence_length // self.spec.docs_per_instance)
        return np.bincount(self.doc_file, weights=read, minlength=len(self.paths)).astype(np.int64).tolist()


def open_interleaved(
    run: OlmoCoreRun, paths: list[str], size_bytes: list[int], documents: list[np.ndarray], index_files: list[str]
) -> InterleavedInstances:
    """The interleaved instances over the padded dataset's `documents` (per file; `index_files`: where OLMo-core
    keeps each): OLMo-core's interleaving files when found in the dataset's work_dir (checked), else rebuilt."""
    spec = run.interleaving
    assert spec is not None
    folder = os.path.join(run.dataset_work_dir, f"dataset-{dataset_fingerprint(run, paths, size_bytes)}")
    exempt, mixable = split_exempt(run, paths, documents)
    stored, stored_exempt = os.path.join(folder, INTERLEAVABLE), os.path.join(folder, EXEMPT)
    if os.path.isfile(stored) and (spec.exempt_paths is None or os.path.isfile(stored_exempt)):
        order = _stored(stored)
        if os.path.isfile(stored_exempt):
            exempt = _stored(stored_exempt)
        n = sum(len(d) for d in documents)
        if not np.array_equal(np.sort(np.concatenate([exempt, order])), np.arange(n)):
            raise DataError(
                f"{stored}: not OLMo-core's interleaving of these token files' {n:,} documents (each once): damaged "
                f"or another run's; remove {folder} to interleave again"
            )
        return InterleavedInstances(run, paths, documents, order, exempt, folder, f"read from {folder}", index_files)
    if spec.exempt_paths and not len(exempt):
        raise DataError(
            f"{run.source}: dataset.interleaving_exempt_paths names none of dataset.paths' documents; OLMo-core "
            "fails writing an empty exempt file (list the exempt token files exactly as dataset.paths gives them)"
        )
    if not len(mixable):
        raise DataError(f"{run.source}: every document is interleaving-exempt; OLMo-core fails on none to interleave")
    order = np.random.Generator(np.random.PCG64(spec.seed)).permutation(mixable).astype(np.int64)
    note = f"rebuilt (OLMo-core's interleaving files not found in {folder})"
    return InterleavedInstances(run, paths, documents, order, exempt, folder, note, index_files)


def split_exempt(run: OlmoCoreRun, paths: list[str], documents: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The exempt documents' numbers (dataset order) and the interleavable ones' (sorted), as OLMo-core splits
    them: by each dataset path's string being one of interleaving_exempt_paths."""
    spec = run.interleaving
    assert spec is not None
    counts = [len(d) for d in documents]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if not spec.exempt_paths:
        return np.zeros(0, dtype=np.int64), np.arange(int(offsets[-1]), dtype=np.int64)
    exempt_files = [k for k, p in enumerate(paths) if p in spec.exempt_paths]
    exempt = [np.arange(offsets[k], offsets[k + 1]) for k in exempt_files]
    ids = np.concatenate(exempt).astype(np.int64) if exempt else np.zeros(0, dtype=np.int64)
    return ids, np.setdiff1d(np.arange(int(offsets[-1]), dtype=np.int64), ids)


def _stored(path: str) -> np.ndarray:
    """One of OLMo-core's uint32 document-number files."""
    if os.path.getsize(path) % INDEX_DTYPE.itemsize:
        raise DataError(
            f"{path}: {os.path.getsize(path):,} bytes is not OLMo-core's uint32 document numbers; remove it"
        )
    return np.fromfile(path, dtype=INDEX_DTYPE).astype(np.int64)


def write_interleaving(inter: InterleavedInstances, folder: str) -> list[str]:
    """OLMo-core's files of an interleaved dataset under its names and bytes in `folder` (its work_dir): each
    file's documents in dataset-common, the interleaving in dataset-{fingerprint}; one already there is kept only
    when identical, byte for byte."""
    files = [
        (os.path.join(folder, "dataset-common", os.path.basename(name)), spans.reshape(-1), "documents")
        for name, spans in zip(inter.index_files, inter.per_file, strict=True)
    ]
    sub = os.path.join(folder, os.path.basename(inter.folder))
    files.append((os.path.join(sub, INTERLEAVABLE), inter.order, "interleaving"))
    if inter.spec.exempt_paths:
        files.append((os.path.join(sub, EXEMPT), inter.exempt, "exempt documents"))
    lines = []
    for path, array, what in dict((f[0], f) for f in files).values():
        data = np.asarray(array).astype(INDEX_DTYPE).tobytes()
        if keep_or_write(path, data, f"not the {what} OLMo-core writes for this dataset; remove it, or check the run"):
            entries = len(data) // INDEX_DTYPE.itemsize
            lines.append(f"interleaved: wrote {path} ({entries:,} entries): OLMo-core's name and bytes")
        else:
            lines.append(f"interleaved: {path} is there, identical to OLMo-core's (kept)")
    return lines
