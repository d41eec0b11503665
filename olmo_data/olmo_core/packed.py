"""OLMo-core's `NumpyPackedFSLDataset`: documents packed whole into instances by optimized best-fit decreasing.

OLMo-core 3.0.0 packs each group of `source_group_size` consecutive token files (after `source_permutation_seed`)
on its own, the group's files read as one concatenated array:

* documents are found as its `iter_document_indices` finds them in a local file: without a BOS id a document ends
  at every EOS; with one, where an EOS is followed by the BOS (and at an EOS that ends the file). Tokens after
  the last boundary are no document. A document longer than the sequence length L is cut to its first L tokens
  (`long_doc_strategy: truncate`) or into pieces of L (`fragment`).
* OBFD: documents sorted by length, longest first (numpy's `argsort` of the negated lengths, as OLMo-core calls
  it: ties keep numpy's order), each put into the open instance with the least room that holds it (the earliest
  opened among equals), else into a new one. Instances are numbered in the order they were opened, group after
  group; each is its documents in the order they went in, padded to L with the pad id (label mask False there).
* `generate_doc_lengths`: the instance's `doc_lens`, OLMo-core's `get_document_lengths` of the padded row (padding
  after the last EOS counts as one more document; a pad id equal to the EOS makes each pad token one).

With `use_array_if_local: false`, or for a remote file, the documents are the rows of the `.csv.gz` beside the
file instead (so a document without its EOS stays one), and `doc_lens` are those documents' lengths with the
padding split as OLMo-core splits it.

OLMo-core keeps each group's result in `work_dir/dataset-common` (`document-indices`, `instance-offsets`,
`documents-by-instance`, uint64, named by a sha256 of the group's paths, sizes, strategy, index dtype and, with
metadata, each metadata file's own sha256); those are read when all three are there, else the packing is rebuilt
here, byte for byte the same.
"""

from __future__ import annotations

import hashlib
import os
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from olmo_data.dataset import LABEL_MASK_DTYPE, DocIndex, DocumentSpan, read_arrays
from olmo_data.errors import DataError
from olmo_data.io import open_file, read_bytes
from olmo_data.olmo_core.cache_files import keep_or_write
from olmo_data.olmo_core.config import NUMPY_DTYPES, OlmoCoreRun, local_path

SCAN_TOKENS = 1 << 24  # tokens per read when finding document boundaries (bounded memory)
CACHE_NAMES = ("document-indices", "instance-offsets", "documents-by-instance")
INDEX_DTYPE = np.dtype("<u8")  # OLMo-core's indices_dtype for packing (np.uint64)


@dataclass(frozen=True)
class PackedGroup:
    """One packed source group: its files, their tokens, and OLMo-core's three arrays for it."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]  # tokens per file
    documents: np.ndarray  # (n_docs, 2) start/end in the group's concatenated tokens, longest first
    instance_offsets: np.ndarray  # (n_instances, 2) [start, end) into docs_by_instance
    docs_by_instance: np.ndarray  # (n_docs,) document ids (rows of `documents`), instance after instance
    note: str  # where the packing came from ("read from ..." or "rebuilt ...")
    from_metadata: bool = False  # documents from .csv.gz metadata (use_array_if_local false, or a remote file)

    def pieces(self, instance: int) -> list[tuple[int, str, int, int]]:
        """(file in group, path, start, end) of each document of `instance` of this group, in its order."""
        lo, hi = (int(x) for x in self.instance_offsets[instance])
        out = []
        starts = np.cumsum([0, *self.sizes])
        for doc in self.docs_by_instance[lo:hi].tolist():
            start, end = (int(x) for x in self.documents[doc])
            k = int(np.searchsorted(starts, start, side="right")) - 1
            out.append((k, self.paths[k], start - int(starts[k]), end - int(starts[k])))
        return out


def pack_lengths(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """OLMo-core's `InstancePacker.pack_documents` over documents already sorted longest first: each goes into the
    open bin with the least room left that holds it (the first opened among those), else a new bin. Its segment
    tree answers "smallest room >= n with a bin"; a sorted list of the rooms that have bins answers the same."""
    bins: list[list[int]] = []
    by_room: dict[int, deque[int]] = {}
    rooms: list[int] = []  # sorted rooms (1..capacity-1) that some open bin has
    for doc, n in enumerate(lengths.tolist()):
        at = bisect_left(rooms, n)
        if at == len(rooms):
            bins.append([])
            b, room = len(bins) - 1, capacity
        else:
            room = rooms[at]
            queue = by_room[room]
            b = queue.popleft()
            if not queue:
                del rooms[at]
        bins[b].append(doc)
        left = room - n
        if left > 0:
            queue = by_room.setdefault(left, deque())
            if not queue:
                insort(rooms, left)
            queue.append(b)
    return bins


def document_bounds(run: OlmoCoreRun, path: str, n_tokens: int) -> np.ndarray:
    """(n, 2) documents of a local token file as OLMo-core's `iter_document_indices` finds them (see the module)."""
    dtype = np.dtype(NUMPY_DTYPES[run.dtype]).newbyteorder("<")
    ends: list[np.ndarray] = []
    bos = run.bos_token_id
    with open(path, "rb") as f:
        for lo in range(0, n_tokens, SCAN_TOKENS):
            # one token more than the chunk (when there is one): an EOS at its end is judged by the BOS after it
            want = min(SCAN_TOKENS + 1, n_tokens - lo)
            f.seek(lo * dtype.itemsize)
            chunk = np.frombuffer(f.read(want * dtype.itemsize), dtype=dtype)
            own = min(SCAN_TOKENS, n_tokens - lo)
            if bos is None:
                hit = np.flatnonzero(chunk[:own] == run.eos_token_id)
            else:
                hit = np.flatnonzero((chunk[:-1] == run.eos_token_id) & (chunk[1:] == bos))
                hit = hit[hit < own]
                if lo + own == n_tokens and own and chunk[own - 1] == run.eos_token_id:
                    hit = np.append(hit, own - 1)
            ends.append(hit.astype(np.int64) + lo + 1)
    end = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    return np.stack([np.concatenate([[0], end[:-1]]), end], axis=1).astype(np.int64)


def metadata_bounds(path: str, n_tokens: int, *, packing: bool = True) -> np.ndarray:
    """(n, 2) documents of a token file from its .csv.gz rows (start, end, ...), each checked to lie within the
    file as OLMo-core checks it. For packing (and composable sources) a row that ends before it starts, or an
    empty one, is refused too: OLMo-core's packer fails on it. The VSL dataset (`packing=False`) takes both, as
    OLMo-core's does: it cuts such a row into no pieces."""
    verb = "packs" if packing else "reads"
    meta = metadata_of(path)
    rows: list[tuple[int, int]] = []
    try:
        with open_file(meta, "rt") as f:
            for number, line in enumerate(f, start=1):
                fields = line.split(",")
                try:
                    start, end = int(fields[0]), int(fields[1])
                except (ValueError, IndexError) as e:
                    raise DataError(f"{meta}: row {number} is not start,end,... token offsets") from e
                if start >= n_tokens or end > n_tokens or (packing and end < start):
                    raise DataError(
                        f"{meta}: row {number} is tokens [{start:,}, {end:,}), outside its token file {path} "
                        f"({n_tokens:,} tokens); the metadata does not belong to these tokens"
                    )
                if packing and end == start:  # OLMo-core's packer fails on one (or puts it where this one would not)
                    raise DataError(
                        f"{meta}: row {number} is an empty document (tokens [{start:,}, {end:,})); "
                        "OLMo-core's packer cannot place one: remove the row"
                    )
                rows.append((start, end))
    except (OSError, EOFError) as e:
        raise DataError(f"{meta}: OLMo-core {verb} {path}'s documents from this metadata file ({e})") from e
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def cut_long(docs: np.ndarray, L: int, strategy: str) -> np.ndarray:
    """Documents longer than L: their first L tokens (truncate) or consecutive pieces of L (fragment)."""
    if strategy == "truncate":
        out = docs.copy()
        out[:, 1] = out[:, 0] + np.minimum(out[:, 1] - out[:, 0], L)
        return out
    rows: list[np.ndarray] = []
    for start, end in docs.tolist():
        if end - start > L:
            cuts = np.arange(start, end, L, dtype=np.int64)
            rows.append(np.stack([cuts, np.minimum(cuts + L, end)], axis=1))
        else:
            rows.append(np.array([[start, end]], dtype=np.int64))
    return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)


def from_metadata(run: OlmoCoreRun, path: str) -> bool:
    """Whether OLMo-core takes this file's documents from its .csv.gz (`iter_document_indices`'s rule)."""
    return run.use_array_if_local is False or not local_path(path)


def metadata_of(path: str) -> str:
    """The .csv.gz OLMo-core reads a token file's documents from (`basename.replace('.npy', '.csv.gz')`)."""
    head, _, name = path.rpartition("/")
    return f"{head}/{name.replace('.npy', '.csv.gz')}" if head else name.replace(".npy", ".csv.gz")


def metadata_digest(path: str) -> str:
    """sha256 of a token file's metadata file's bytes, as OLMo-core keys its packing files by it."""
    meta = metadata_of(path)
    try:
        return hashlib.sha256(read_bytes(meta)).hexdigest()
    except (OSError, DataError) as e:
        raise DataError(f"{meta}: OLMo-core packs {path}'s documents from this metadata file ({e})") from e


def cache_path(
    run: OlmoCoreRun,
    name: str,
    paths: tuple[str, ...],
    size_bytes: tuple[int, ...],
    digests: dict[str, str] | None = None,
) -> str:
    """OLMo-core's name for one of a group's packing files (`_get_indices_path` with its packing extra ids;
    `digests`: the metadata digests of the group's files read from metadata, computed when not given)."""
    digest = hashlib.sha256()
    for path, size in zip(paths, size_bytes, strict=True):
        digest.update(str(path).encode())
        digest.update(str(size).encode())
    extra = [run.long_doc_strategy, "uint64"]
    if run.use_array_if_local is not None:
        extra.append(f"use_array_if_local={run.use_array_if_local}")
    if any(from_metadata(run, p) for p in paths):
        digests = digests if digests is not None else {p: metadata_digest(p) for p in paths if from_metadata(run, p)}
        extra += [f"metadata={p},sha256={digests[p]}" for p in paths if p in digests]
    for e in extra:
        digest.update(e.encode())
    return os.path.join(
        run.dataset_work_dir, "dataset-common", f"{name}-{run.sequence_length}-{digest.hexdigest()}.npy"
    )


def pack_group(run: OlmoCoreRun, paths: tuple[str, ...], sizes: tuple[int, ...], itemsize: int) -> PackedGroup:
    """A group's packing: OLMo-core's files when all three are in the work_dir (checked), else rebuilt."""
    L = run.sequence_length
    meta = any(from_metadata(run, p) for p in paths)
    digests = {p: metadata_digest(p) for p in paths if from_metadata(run, p)}
    stored = [cache_path(run, name, paths, tuple(s * itemsize for s in sizes), digests) for name in CACHE_NAMES]
    if all(os.path.isfile(p) for p in stored):
        return replace(_read_cached(stored, paths, sizes, L), from_metadata=meta)
    parts, offset = [], 0
    for path, n in zip(paths, sizes, strict=True):
        found = metadata_bounds(path, n) if from_metadata(run, path) else document_bounds(run, path, n)
        parts.append(cut_long(found, L, run.long_doc_strategy) + offset)
        offset += n
    docs = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    lengths = docs[:, 1] - docs[:, 0]
    order = np.argsort(-1 * lengths.astype(np.int64))  # OLMo-core's call (numpy's default sort), ties alike
    docs = np.take(docs, order, axis=0)
    bins = pack_lengths(docs[:, 1] - docs[:, 0], L)
    counts = np.array([len(b) for b in bins], dtype=np.int64)
    ends = np.cumsum(counts)
    offsets = np.stack([ends - counts, ends], axis=1) if len(bins) else np.zeros((0, 2), dtype=np.int64)
    flat = np.array([d for b in bins for d in b], dtype=np.int64)
    where = os.path.dirname(stored[0])
    note = f"rebuilt (OLMo-core's packing files not found in {where})"
    return PackedGroup(paths, sizes, docs, offsets, flat, note, meta)


def _read_cached(stored: list[str], paths: tuple[str, ...], sizes: tuple[int, ...], L: int) -> PackedGroup:
    """OLMo-core's three packing files of a group, checked before any is used (a damaged or foreign file would
    read other tokens): pairs within the group's tokens, each document at most L, each instance's at most L."""
    arrays = []
    for p in stored:
        if os.path.getsize(p) % 8:
            raise DataError(f"{p}: {os.path.getsize(p):,} bytes is not OLMo-core's uint64 packing array; remove it")
        arrays.append(np.fromfile(p, dtype=INDEX_DTYPE).astype(np.int64))
    docs, offsets, flat = arrays[0].reshape(-1, 2), arrays[1].reshape(-1, 2), arrays[2]
    total = sum(sizes)
    lengths = docs[:, 1] - docs[:, 0]
    bad = (
        len(docs) != len(flat)
        or bool(((lengths < 0) | (lengths > L) | (docs[:, 1] > total)).any())
        or bool(((flat < 0) | (flat >= len(docs))).any())
        or bool(((offsets[:, 0] > offsets[:, 1]) | (offsets[:, 1] > len(flat))).any())
    )
    if not bad and len(offsets):
        per = np.add.reduceat(lengths[flat], offsets[:, 0]) if len(flat) else np.zeros(len(offsets), np.int64)
        bad = bool((per > L).any())
    if bad:
        raise DataError(
            f"{stored[1]}: OLMo-core's packing files for {', '.join(paths)} do not fit these token files "
            f"({total:,} tokens, instances of {L}): damaged or another run's; remove the three "
            f"{'/'.join(CACHE_NAMES)} files to pack again"
        )
    return PackedGroup(paths, sizes, docs, offsets, flat, f"read from {os.path.dirname(stored[0])}")


class PackedInstances:
    """The packed instances of an OLMo-core run, numbered as OLMo-core numbers them, with their pieces."""

    def __init__(self, run: OlmoCoreRun, groups: list[PackedGroup]) -> None:
        self.run = run
        self.groups = groups
        counts = [len(g.instance_offsets) for g in groups]
        self.group_offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.group_offsets[-1])

    def doc_lens(self, indices: npt.ArrayLike, tokens: np.ndarray) -> list[np.ndarray]:
        """OLMo-core's `doc_lens` of each instance's row: `get_document_lengths` of the padded row, or, where the
        group's documents came from metadata, the lengths of its documents and the padding split as OLMo-core
        splits it (one segment per EOS in it; with a BOS, the last document's boundary judged with its last token)."""
        out = []
        eos, bos = self.run.eos_token_id, self.run.bos_token_id
        for index, row in zip(np.asarray(indices).reshape(-1).tolist(), tokens, strict=True):
            g = int(np.searchsorted(self.group_offsets, index, side="right")) - 1
            if not self.groups[g].from_metadata:
                out.append(doc_lengths(row, eos, bos))
                continue
            lens = [e - s for _, _, s, e in self.pieces(index)]
            padding = len(row) - sum(lens)
            if padding > 0 and bos is None:
                lens += doc_lengths(row[-padding:], eos, None).tolist()
            elif padding > 0:
                tail = doc_lengths(row[-padding - 1 :], eos, bos).tolist()
                lens[-1] += tail[0] - 1
                lens += tail[1:]
            out.append(np.asarray(lens, dtype=np.int32))
        return out

    def first_files(self) -> np.ndarray:
        """Per instance, the dataset's index of the file its first document is in (`stats` counts by it)."""
        out = []
        for g, group in enumerate(self.groups):
            first_docs = group.docs_by_instance[group.instance_offsets[:, 0]] if len(group.docs_by_instance) else []
            starts = group.documents[first_docs, 0] if len(first_docs) else np.zeros(0, dtype=np.int64)
            bounds = np.cumsum([0, *group.sizes])
            out.append(np.searchsorted(bounds, starts, side="right") - 1 + g * self.run.source_group_size)
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)

    def held_per_file(self) -> list[int]:
        """Tokens of each file (in dataset order) that some instance holds: the rest are cut from long documents
        (truncate) or after a file's last document."""
        out: list[int] = []
        for group in self.groups:
            bounds = np.cumsum([0, *group.sizes])
            files = np.searchsorted(bounds, group.documents[:, 0], side="right") - 1
            lengths = group.documents[:, 1] - group.documents[:, 0]
            out += np.bincount(files, weights=lengths, minlength=len(group.sizes)).astype(np.int64).tolist()
        return out

    def holding(self, path: str, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(instance, first file token, tokens, position in the instance) of every document piece holding a token
        of tokens [start, end) of `path`, for `trace`: each document is in one instance, at one place."""
        out: list[tuple[int, int, int, int]] = []
        for g, group in enumerate(self.groups):
            if path not in group.paths:
                continue
            offset = sum(group.sizes[: group.paths.index(path)])
            docs = group.documents
            hit = np.flatnonzero((docs[:, 0] < offset + end) & (docs[:, 1] > offset + start))
            if not len(hit):
                continue
            counts = group.instance_offsets[:, 1] - group.instance_offsets[:, 0]
            instance_of = np.empty(len(docs), dtype=np.int64)
            instance_of[group.docs_by_instance] = np.repeat(np.arange(len(counts)), counts)
            lengths = docs[group.docs_by_instance, 1] - docs[group.docs_by_instance, 0]
            before = np.cumsum(lengths) - lengths  # tokens before each flat entry, from the start of the whole list
            at = np.empty(len(docs), dtype=np.int64)
            at[group.docs_by_instance] = before - np.repeat(before[group.instance_offsets[:, 0]], counts)
            first = int(self.group_offsets[g])
            for d in hit.tolist():
                a, b = int(docs[d, 0]), int(docs[d, 1])
                out.append((first + int(instance_of[d]), a - offset, b - a, int(at[d])))
        return sorted(out)

    def pieces(self, index: int) -> list[tuple[int, str, int, int]]:
        """(file index in the dataset, path, start, end) of each document instance `index` holds, in order."""
        if not 0 <= index < len(self):
            raise DataError(f"instance {index} is out of range: OLMo-core's packed dataset has {len(self)}")
        g = int(np.searchsorted(self.group_offsets, index, side="right")) - 1
        first_file = g * self.run.source_group_size
        local = index - int(self.group_offsets[g])
        return [(first_file + k, p, s, e) for k, p, s, e in self.groups[g].pieces(local)]

    def rows(
        self, indices: npt.ArrayLike, label_mask_paths: tuple[str, ...] | None
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Token ids (int64, (n, L)), the label mask (True on document tokens, and where a mask file says so),
        and each instance's tokens before its padding."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        L, dtype = self.run.sequence_length, NUMPY_DTYPES[self.run.dtype]
        per = [self.pieces(i) for i in idx]
        flat = [p for ps in per for p in ps]
        reads: list[tuple[str, object, int, int]] = [(p, dtype, s, e - s) for _, p, s, e in flat]
        if label_mask_paths is not None:
            reads += [(label_mask_paths[k], LABEL_MASK_DTYPE, s, e - s) for k, _, s, e in flat]
        arrays = read_arrays(reads)  # type: ignore[arg-type]
        tokens = np.full((len(idx), L), self.run.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(idx), L), dtype=bool)
        used, at = [], 0
        for row, ps in enumerate(per):
            col = 0
            for _ in ps:
                part = arrays[at]
                tokens[row, col : col + len(part)] = part
                mask[row, col : col + len(part)] = arrays[len(flat) + at] if label_mask_paths is not None else True
                col += len(part)
                at += 1
            used.append(col)
        return tokens, mask, used


def doc_lengths(row: np.ndarray, eos: int, bos: int | None) -> np.ndarray:
    """OLMo-core's `get_document_lengths` of one instance's ids (padding included)."""
    n = len(row)
    if bos is None:
        cuts = np.flatnonzero(row == eos)
        if row[-1] != eos:
            cuts = np.append(cuts, n - 1)
    else:
        cuts = np.append(np.flatnonzero((row[:-1] == eos) & (row[1:] == bos)), n - 1)
    return np.diff(np.concatenate([[-1], cuts])).astype(np.int32)


def open_packed(run: OlmoCoreRun, paths: list[str], tokens: list[int], itemsize: int) -> PackedInstances:
    """Every group of the run packed (or its packing read) as OLMo-core packs it."""
    size = run.source_group_size
    groups = [
        pack_group(run, tuple(paths[i : i + size]), tuple(tokens[i : i + size]), itemsize)
        for i in range(0, len(paths), size)
    ]
    return PackedInstances(run, groups)


def packed_documents(docs: DocIndex, pieces: tuple[tuple[str, int, int], ...]) -> list[DocumentSpan] | None:
    """The metadata documents of a packed instance: each piece's, placed where the piece sits in the instance
    (None when a piece's token file has no metadata)."""
    out: list[DocumentSpan] = []
    at = 0
    for path, start, end in pieces:
        spans = docs.lookup(path, start, end)
        if spans is None:
            return None
        out += [replace(d, instance_start=d.instance_start + at, instance_end=d.instance_end + at) for d in spans]
        at += end - start
    return out


def write_packing(run: OlmoCoreRun, packed: PackedInstances, folder: str, itemsize: int) -> list[str]:
    """Each group's three packing files under OLMo-core's names and bytes in `folder/dataset-common` (its dataset
    takes them as its own with that work_dir); one already there is kept only when identical, byte for byte."""
    lines = []
    for group in packed.groups:
        sizes = tuple(s * itemsize for s in group.sizes)
        arrays = (group.documents.reshape(-1), group.instance_offsets.reshape(-1), group.docs_by_instance)
        for name, array in zip(CACHE_NAMES, arrays, strict=True):
            path = os.path.join(folder, "dataset-common", os.path.basename(cache_path(run, name, group.paths, sizes)))
            data = array.astype(INDEX_DTYPE).tobytes()
            refusal = (
                f"not the {name} OLMo-core packs for {', '.join(group.paths)}; remove it, or check the run's dataset"
            )
            if keep_or_write(path, data, refusal):
                lines.append(f"packing: wrote {path} ({len(array):,} entries): OLMo-core's name and bytes")
            else:
                lines.append(f"packing: {path} is there, identical to OLMo-core's (kept)")
    return lines
