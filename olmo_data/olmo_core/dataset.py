"""OLMo-core's instances: `NumpyFSLDataset` (and its source mixture) and `NumpyPaddedFSLDataset`, read here.

* `NumpyFSLDataset` cuts every file on its own into `file_tokens // L` instances (the tail dropped) and numbers them
  file after file: the same instances as `olmo_data.dataset.instances`. With `max_target_sequence_length` M it keeps
  only
  `file_tokens // M` whole runs of `M // L` instances per file, so every epoch's chunks are whole.
* Its mixture (`NumpyFSLDatasetMixture`) is the same over the mixture's file occurrences, each cut to its token
  budget: the first `budget // L` instances of the file (see `olmo_data.olmo_core.mixture`).
* `NumpyPaddedFSLDataset` makes one instance per document: its first `L` tokens, padded to `L` with the pad id;
  `label_mask` is False on padding (and where the file's own label mask says so). Documents are found as OLMo-core
  finds them: in a local file, by its EOS tokens (a document ends at each EOS, whatever the BOS id: OLMo-core
  3.0.0 does not pass it here; tokens after the last EOS are no document); in a remote one, from the `.csv.gz`
  beside it. OLMo-core keeps what it found in `work_dir/dataset-common/instance-indices-{L}-{sha256}.npy`;
  that file is read when it is there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from olmo_data.dataset import LABEL_MASK_DTYPE, MANIFEST_NAME, Manifests, read_arrays
from olmo_data.errors import DataError
from olmo_data.io import file_size, file_sizes, is_remote, open_file
from olmo_data.olmo_core.config import NUMPY_DTYPES, OlmoCoreRun, local_path
from olmo_data.olmo_core.interleaved import InterleavedInstances, open_interleaved
from olmo_data.olmo_core.mixture import allocate_mixture
from olmo_data.olmo_core.packed import PackedInstances, open_packed
from olmo_data.olmo_core.vsl import VSLInstances, open_vsl

SCAN_TOKENS = 1 << 24  # tokens per read when finding EOS tokens in a local file (bounded memory)
SAMPLE_TOKENS = 4096  # ids checked at the start of a token file no manifest describes


@dataclass(frozen=True)
class CoreInstance:
    """Where an OLMo-core instance lives: `length` tokens from `start` of `path` (file occurrence `file_index`)."""

    index: int
    file_index: int
    path: str
    start: int
    length: int
    source: str | None  # the mixture source, None without a mixture
    # packed: (path, start, end) of each document the instance holds, in order (`path`/`start` are the first's,
    # `length` their total); empty for the other datasets, whose instance is `length` tokens from `start`
    pieces: tuple[tuple[str, int, int], ...] = ()
    # interleaved: each piece's position in the instance (empty: the pieces follow each other from position 0)
    at: tuple[int, ...] = ()


class OlmoCoreDataset:
    """The instances of an OLMo-core run's dataset, numbered as OLMo-core numbers them (see `open_core_dataset`)."""

    def __init__(
        self,
        run: OlmoCoreRun,
        paths: list[str],
        file_tokens: list[int],
        *,
        sources: list[str | None] | None = None,
        documents: list[np.ndarray] | None = None,
        packed: PackedInstances | None = None,
        vsl: VSLInstances | None = None,
        interleaved: InterleavedInstances | None = None,
    ) -> None:
        self.run = run
        self.paths = paths
        self.file_tokens = file_tokens
        self.sources = sources or [None] * len(paths)
        self.itemsize = int(np.dtype(NUMPY_DTYPES[run.dtype]).itemsize)
        self.documents = documents  # padded: per file, (n, 2) start/end token offsets of its instances
        self.packed = packed  # packed: its groups' packing (olmo_data.olmo_core.packed)
        self.vsl = vsl  # vsl: its power-of-two pieces and buckets (olmo_data.olmo_core.vsl)
        self.interleaved = interleaved  # interleaved: its instances (olmo_data.olmo_core.interleaved)
        L = run.sequence_length
        if interleaved is not None:  # counted by the file of their first document
            counts = np.bincount(interleaved.first_files(), minlength=len(paths)).tolist()
        elif packed is not None:
            counts = packed_counts(packed, len(paths))
        elif vsl is not None:
            counts = vsl.counts
        elif documents is not None:
            counts = [len(d) for d in documents]
        elif run.max_target_sequence_length is not None:
            counts = [t // run.max_target_sequence_length * run.chunk_size for t in file_tokens]
        else:
            counts = [t // L for t in file_tokens]
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1]) if self.packed is None else len(self.packed)

    def locate(self, indices: npt.ArrayLike) -> list[CoreInstance]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise DataError(f"instance {int(idx.max())} is out of range: OLMo-core's dataset has {len(self)}")
        if self.packed is not None:
            return [packed_instance(int(i), self.packed.pieces(int(i))) for i in idx.tolist()]
        if self.vsl is not None:  # a piece of a document: `length` tokens from `start`, never padded
            spans = self.vsl.locate(idx)
            return [
                CoreInstance(i, k, self.paths[k], a, b - a, None)
                for i, (k, a, b) in zip(idx.tolist(), spans, strict=True)
            ]
        if self.interleaved is not None:
            return [interleaved_instance(int(i), *self.interleaved.pieces(int(i))) for i in idx.tolist()]
        files = np.searchsorted(self.offsets, idx, side="right") - 1
        out = []
        L = self.run.sequence_length
        for i, k in zip(idx.tolist(), files.tolist(), strict=True):
            local = i - int(self.offsets[k])
            if self.documents is not None:
                start, end = (int(x) for x in self.documents[k][local])
                out.append(CoreInstance(i, k, self.paths[k], start, min(end - start, L), self.sources[k]))
            else:
                out.append(CoreInstance(i, k, self.paths[k], local * L, L, self.sources[k]))
        return out

    def get_batch(self, indices: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray | None]:
        """Token ids (int64, (n, L)) as OLMo-core's collator stacks them, and the label mask (bool) when OLMo-core
        gives one (padded datasets always; plain ones when the run has label mask files), else None."""
        if self.packed is not None:
            rows, row_mask, _ = self.packed.rows(indices, self.run.label_mask_paths)
            check_vocab(self.run, rows, self.locate(indices))
            return rows, row_mask
        if self.vsl is not None:  # one bucket's instances: (n, its length), no label mask
            rows = self.vsl.rows(indices)
            check_vocab(self.run, rows, self.locate(indices))
            return rows, None
        if self.interleaved is not None:
            return self.interleaved.rows(indices, self.run.label_mask_paths)
        locs = self.locate(indices)
        L = self.run.sequence_length
        dtype = NUMPY_DTYPES[self.run.dtype]
        reads: list[tuple[str, Any, int, int]] = [(loc.path, dtype, loc.start, loc.length) for loc in locs]
        masks_paths = self.run.label_mask_paths
        if masks_paths is not None:
            reads += [(masks_paths[loc.file_index], LABEL_MASK_DTYPE, loc.start, loc.length) for loc in locs]
        arrays = read_arrays(reads)
        tokens = np.full((len(locs), L), self.run.pad_token_id, dtype=np.int64)
        padded = self.documents is not None
        mask = np.zeros((len(locs), L), dtype=bool) if padded or masks_paths is not None else None
        vocab = self.run.vocab_size
        for row, loc in enumerate(locs):
            if len(arrays[row]) and int(arrays[row].max()) >= vocab:  # read as another dtype than the file holds
                at = int(np.argmax(arrays[row] >= vocab))
                raise DataError(
                    f"{loc.path}: token {loc.start + at:,} reads as id {int(arrays[row][at]):,}, past "
                    f"dataset.tokenizer.vocab_size {vocab:,} of {self.run.source}, which reads the file as "
                    f"{self.run.dtype} ({self.run.dtype_from or 'dataset.dtype'}): the file holds another dtype, or "
                    "the config names another tokenizer"
                )
            tokens[row, : loc.length] = arrays[row]
            if mask is not None:
                mask[row, : loc.length] = arrays[len(locs) + row] if masks_paths is not None else True
        return tokens, mask


def open_core_dataset(run: OlmoCoreRun) -> OlmoCoreDataset:
    """The dataset of an OLMo-core run: its files sized (and, for a mixture, allocated) as OLMo-core does, each
    checked to be a file (OLMo-core would count a directory's 4,096 bytes as tokens) whose directory's manifest,
    when it has one of ours, agrees with the dtype the config implies."""
    itemsize = int(np.dtype(NUMPY_DTYPES[run.dtype]).itemsize)
    sizes = prefetch_remote_sizes(run)

    def size_of(path: str, what: str = "token file", key: str = "dataset.paths") -> int:
        if path not in sizes:
            if local_path(path) and os.path.isdir(path):
                raise DataError(
                    f"{run.source}: {key} names {path}, a directory; OLMo-core reads each entry as one {what} "
                    "(list the directory's .npy files, or a glob with expand_glob: true)"
                )
            try:
                sizes[path] = file_size(path)
            except (OSError, DataError) as e:
                raise DataError(f"{run.source}: {what} {path} cannot be read ({e}); check {key}") from e
        return sizes[path]

    if run.mixture is not None:
        key = "dataset.source_mixture_config"
        files = allocate_mixture(
            run.mixture, run.sequence_length, lambda p: size_of(p, key=key) // itemsize, where=run.source
        )
        check_token_files(run, [f.path for f in files], sizes)
        return OlmoCoreDataset(
            run, [f.path for f in files], [f.tokens for f in files], sources=[f.source for f in files]
        )
    paths = list(run.paths)
    tokens = [size_of(p) // itemsize for p in paths]
    check_token_files(run, paths, sizes)
    if run.label_mask_paths is not None:
        for p, m, t in zip(paths, run.label_mask_paths, tokens, strict=True):
            entries = size_of(m, "label mask", "dataset.label_mask_paths")
            if entries != t:
                raise DataError(
                    f"{run.source}: label mask {m} has {entries} entries but its token file {p} has {t} tokens"
                )
    if run.kind == "packed":
        return OlmoCoreDataset(run, paths, tokens, packed=open_packed(run, paths, tokens, itemsize))
    if run.kind == "interleaved" and run.interleaving is not None:  # padded documents (keyed by D too), mixed
        extra = str(run.interleaving.docs_per_instance)
        documents = [padded_instances(run, p, size_of(p), extra) for p in paths]
        stored = [instance_indices_path(run.dataset_work_dir, run.sequence_length, p, size_of(p), extra) for p in paths]
        mixed = open_interleaved(run, paths, [size_of(p) for p in paths], documents, stored)
        return OlmoCoreDataset(run, paths, tokens, interleaved=mixed)
    if run.kind == "vsl":
        return OlmoCoreDataset(run, paths, tokens, vsl=open_vsl(run, paths, tokens, itemsize))
    if run.kind != "padded":
        return OlmoCoreDataset(run, paths, tokens)
    documents = [padded_instances(run, p, size_of(p)) for p in paths]
    return OlmoCoreDataset(run, paths, tokens, documents=documents)


def packed_counts(packed: PackedInstances, n_files: int) -> list[int]:
    """Per file, the packed instances whose first document is in it (what `stats` counts per file)."""
    return np.bincount(packed.first_files(), minlength=n_files).tolist()


def packed_instance(index: int, pieces: list[tuple[int, str, int, int]]) -> CoreInstance:
    """A packed instance as a CoreInstance: its first document's place, its tokens before padding, its pieces."""
    k, path, start, _ = pieces[0]
    length = sum(e - s for _, _, s, e in pieces)
    return CoreInstance(index, k, path, start, length, None, tuple((p, s, e) for _, p, s, e in pieces))


def interleaved_instance(
    index: int, pieces: list[tuple[int, str, int, int]], at: list[int], length: int
) -> CoreInstance:
    """An interleaved instance as a CoreInstance: its first run of file tokens' place, its tokens before padding,
    its runs of file tokens and where each sits."""
    k, path, start, _ = pieces[0] if pieces else (0, "", 0, 0)
    return CoreInstance(index, k, path, start, length, None, tuple((p, s, e) for _, p, s, e in pieces), tuple(at))


def check_vocab(run: OlmoCoreRun, tokens: np.ndarray, locs: list[CoreInstance]) -> None:
    """Every id of a packed batch below the vocabulary size, else one line naming the instance's first file."""
    over = np.flatnonzero((tokens >= run.vocab_size).any(axis=1))
    if len(over):
        loc = locs[int(over[0])]
        raise DataError(
            f"{loc.path}: packed instance {loc.index} reads an id past dataset.tokenizer.vocab_size "
            f"{run.vocab_size:,} of {run.source}, which reads the file as {run.dtype} "
            f"({run.dtype_from or 'dataset.dtype'}): the file holds another dtype, or the config names another "
            "tokenizer"
        )


def prefetch_remote_sizes(run: OlmoCoreRun) -> dict[str, int]:
    """Every remote file the run names (token files, label masks, a mixture's paths) sized at once, concurrently
    and cached (`file_sizes`): {path: size}, so that `size_of` asks nothing more (4,000 lookups one by one were a
    tenth of a repeated inspect-batch); a failure is left for `size_of` to name."""
    paths = list(run.paths) + list(run.label_mask_paths or [])
    if run.mixture is not None:
        paths += [p for source in run.mixture.sources for p in source.paths]
    remote = list(dict.fromkeys(p for p in paths if is_remote(p)))
    if remote:
        with contextlib.suppress(DataError):
            return {p: s for p, s in zip(remote, file_sizes(remote), strict=True) if s is not None}
    return {}


def check_token_files(run: OlmoCoreRun, paths: list[str], sizes: dict[str, int]) -> None:
    """Refuse a token file whose directory's manifest (written by `olmo-data tokenize`) says another dtype than the
    config implies, or another token count than the file holds: read as the config says, every token id, every
    instance and every document offset would be wrong (a uint16 file read as uint32 has half the tokens, each two
    ids in one). A local file no manifest describes has its first SAMPLE_TOKENS ids checked to be in the
    vocabulary (the same misreading gives ids far past it); `get_batch` checks every id it reads."""
    manifests = Manifests()
    for path in dict.fromkeys(paths):
        directory, _, name = path.rpartition("/")
        manifest = manifests.get(directory or ".")
        listed = {e.get("path"): e for e in (manifest or {}).get("files", []) if isinstance(e, dict)}
        if manifest is None or name not in listed:
            if local_path(path):
                check_first_ids(run, path)
            continue
        where = f"{directory or '.'}/{MANIFEST_NAME}"
        recorded = str(manifest.get("dtype"))
        if recorded != run.dtype:
            raise DataError(
                f"{run.source}: {run.dtype_from or 'dataset.dtype ' + run.dtype} disagrees with {where}, which says "
                f"{name} holds {recorded} tokens; set dataset.dtype to {recorded} (or fix dataset.tokenizer), or "
                "check dataset.paths"
            )
        tokens = listed[name].get("tokens")
        itemsize = int(np.dtype(NUMPY_DTYPES[run.dtype]).itemsize)
        if isinstance(tokens, int) and path in sizes and sizes[path] != tokens * itemsize:
            raise DataError(
                f"{path}: {sizes[path]:,} bytes, but {where} says it holds {tokens:,} {recorded} tokens "
                f"({tokens * itemsize:,} bytes); the file changed after it was tokenized"
            )


def check_first_ids(run: OlmoCoreRun, path: str) -> None:
    """The first SAMPLE_TOKENS ids of a local token file are below the vocabulary size (one small read)."""
    dtype = np.dtype(NUMPY_DTYPES[run.dtype]).newbyteorder("<")
    with open(path, "rb") as f:
        raw = f.read(SAMPLE_TOKENS * dtype.itemsize)
    ids = np.frombuffer(raw[: len(raw) // dtype.itemsize * dtype.itemsize], dtype=dtype)
    if len(ids) and int(ids.max()) >= run.vocab_size:
        at = int(np.argmax(ids >= run.vocab_size))
        raise DataError(
            f"{path}: token {at:,} reads as id {int(ids[at]):,}, past dataset.tokenizer.vocab_size "
            f"{run.vocab_size:,} of {run.source}, which reads the file as {run.dtype} "
            f"({run.dtype_from or 'dataset.dtype'}): the file holds another dtype, or the config names another "
            "tokenizer"
        )


def instance_indices_path(work_dir: str, sequence_length: int, path: str, size_bytes: int, extra: str = "") -> str:
    """Where OLMo-core keeps a padded dataset's instance boundaries for `path` (`_get_indices_path`; `extra`: the
    interleaved dataset's docs_per_instance)."""
    digest = hashlib.sha256(str(path).encode() + str(size_bytes).encode() + extra.encode()).hexdigest()
    return os.path.join(work_dir, "dataset-common", f"instance-indices-{sequence_length}-{digest}.npy")


def padded_instances(run: OlmoCoreRun, path: str, size_bytes: int, extra: str = "") -> np.ndarray:
    """(n, 2) start and end of each padded instance of `path`: OLMo-core's file when found, else rebuilt."""
    stored = instance_indices_path(run.dataset_work_dir, run.sequence_length, path, size_bytes, extra)
    if os.path.isfile(stored):
        return stored_instances(stored, path, size_bytes // np.dtype(NUMPY_DTYPES[run.dtype]).itemsize, run)
    docs = document_spans(run, path, size_bytes)
    if len(docs) == 0:
        raise DataError(f"{path}: no documents (OLMo-core refuses a padded dataset file without any)")
    docs[:, 1] = docs[:, 0] + np.minimum(docs[:, 1] - docs[:, 0], run.sequence_length)
    return docs


def stored_instances(stored: str, path: str, n_tokens: int, run: OlmoCoreRun) -> np.ndarray:
    """The instance boundaries OLMo-core wrote for `path` (uint32 start, end pairs), checked before any is used:
    a damaged or foreign file would otherwise read other tokens, or fail as if the token file had shrunk."""
    size = os.path.getsize(stored)
    if size % 8 or size > 8 * max(n_tokens, 1):
        raise DataError(
            f"{stored}: {size:,} bytes is not OLMo-core's instance boundaries for {path} (start, end pairs of uint32, "
            f"at most one pair per token of its {n_tokens:,}); remove it to find the documents again"
        )
    spans = np.fromfile(stored, dtype="<u4").astype(np.int64).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    bad = np.flatnonzero((lengths <= 0) | (lengths > run.sequence_length) | (spans[:, 1] > n_tokens))
    if len(spans) == 0 or bad.size:
        what = "holds no instance" if len(spans) == 0 else f"instance {int(bad[0])} is tokens {spans[bad[0]].tolist()}"
        raise DataError(
            f"{stored}: {what}, not an instance of at most {run.sequence_length} of the {n_tokens:,} tokens of "
            f"{path}; the file is damaged or another run's: remove it to find the documents again"
        )
    return spans


def document_spans(run: OlmoCoreRun, path: str, size_bytes: int) -> np.ndarray:
    """(n, 2) document start/end offsets as OLMo-core's padded dataset finds them (`iter_document_indices` as
    `segment_documents_into_instances` calls it: without the BOS id, so a document ends at every EOS)."""
    dtype = np.dtype(NUMPY_DTYPES[run.dtype]).newbyteorder("<")
    n_tokens = size_bytes // dtype.itemsize
    if local_path(path):
        ends: list[np.ndarray] = []
        with open(path, "rb") as f:
            for lo in range(0, n_tokens, SCAN_TOKENS):
                chunk = np.frombuffer(f.read(min(SCAN_TOKENS, n_tokens - lo) * dtype.itemsize), dtype=dtype)
                ends.append(np.flatnonzero(chunk == run.eos_token_id) + lo + 1)
        end = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, dtype=np.int64)
        return np.stack([np.concatenate([[0], end[:-1]]), end], axis=1) if len(end) else np.zeros((0, 2), np.int64)
    meta = path[: -len(".npy")] + ".csv.gz" if path.endswith(".npy") else path + ".csv.gz"
    rows: list[tuple[int, int]] = []
    try:
        with open_file(meta, "rt") as f:
            for line in f:
                start, end_s = line.split(",")[:2]
                rows.append((int(start), int(end_s)))
    except (OSError, DataError) as e:
        raise DataError(f"{meta}: OLMo-core reads a remote file's documents from this metadata file ({e})") from e
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)
