"""The instance index: fixed-length training instances over many token files, cut the way OLMo cuts them.

OLMo's `MemMapDataset` cuts every token file on its own into `file_tokens // sequence_length` instances and
drops the leftover tokens at the end of each file; instances are numbered file after file in the order the
paths are given. We follow that rule exactly, so an OLMo config and its published `global_indices.npy` name
the same instances here. Instance `i` is found by a binary search over the cumulative instance counts, and its
tokens are one positioned read (`os.pread`, local files) or one ranged read (http(s)://, s3://, gs://), so a lookup
costs the same whatever the dataset size. A batch's remote ranges are handed to `olmo_data.remote` together, which
fetches them concurrently, merged where they neighbour, with retries.

The token files come from `olmo_data.dataset.token_files` (directories expanded through their manifests, every file
sized and checked). A mixture (see `olmo_data.dataset.mixture`) adds one level of indirection: its manifest lists, per
source, the token files and the selected instance ids within them; the mixed dataset's instances are those
selections, source after source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from olmo_data.config import TrainConfig
from olmo_data.dataset.manifest import DTYPES
from olmo_data.dataset.mixture import load_mix
from olmo_data.dataset.token_files import TokenFile, token_files
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.remote import remote_reader

LABEL_MASK_DTYPE = np.bool_  # OLMo writes label masks as one byte per token


@dataclass(frozen=True)
class InstanceLocation:
    """Where instance `index` lives: the file (by position in `InstanceSource.files`) and its first token."""

    index: int
    base_index: int  # the instance's number in the concatenation of all files (== index without a mix)
    file_index: int
    path: str
    token_offset: int
    source: str | None  # the mixture source name, None without a mix


class InstanceSource:
    """Fixed-length instances over token files (optionally through a mix): the one reader the trainer and
    `inspect-batch` share, so that both see exactly the same tokens for an instance index.

    Build it with `open_dataset`. All methods are read-only and thread-safe.
    """

    def __init__(
        self,
        files: Sequence[TokenFile],
        sequence_length: int,
        *,
        mix: dict[str, Any] | None = None,
        mix_selections: Sequence[np.ndarray] | None = None,
        mix_file_ranges: Sequence[tuple[int, int]] | None = None,
        mix_path: str | None = None,
    ) -> None:
        if sequence_length <= 0:
            raise DataError(f"sequence_length must be a positive number of tokens, got {sequence_length}")
        self.files = list(files)
        self.sequence_length = int(sequence_length)
        counts = np.array([f.num_tokens // self.sequence_length for f in self.files], dtype=np.int64)
        # offsets[k] = first instance of file k; offsets[-1] = instances over all files (before any mix)
        self.file_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.mix = mix
        self.mix_path = mix_path
        self._selections = list(mix_selections or [])
        self._source_names = [str(s["name"]) for s in mix["sources"]] if mix else []
        self._source_file_ranges = list(mix_file_ranges or [])
        sel_counts = np.array([len(s) for s in self._selections], dtype=np.int64)
        self._selection_offsets = np.concatenate([[0], np.cumsum(sel_counts)]).astype(np.int64)
        self.has_label_masks = any(f.label_mask_path for f in self.files)

    # -- size and identity -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        if self.mix is not None:
            return int(self._selection_offsets[-1])
        return int(self.file_offsets[-1])

    @property
    def assumed_dtype(self) -> str | None:
        """The dtype taken for token files that neither a manifest nor data.dtype describes (OLMo's default,
        uint16), for commands to say so; None when every file's dtype was given."""
        assumed = {f.dtype for f in self.files if f.dtype_assumed}
        return ", ".join(sorted(assumed)) or None

    @property
    def num_tokens(self) -> int:
        """Tokens in the instances (leftovers at the end of each file excluded)."""
        return len(self) * self.sequence_length

    def fingerprint(self) -> str:
        """A digest of what the instance numbers mean: token files (path, size, dtype), label masks, sequence
        length and mix. It is stored beside a data order so that an order is never used with other data: if a
        file is added, removed, reordered, grows or shrinks, or the sequence length or mix changes, the digest
        changes.
        """
        h = hashlib.sha256()
        h.update(json.dumps(self.describe(), sort_keys=True).encode())
        return h.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """What `fingerprint()` digests, in readable form (recorded with an order to explain a mismatch)."""
        return {
            "sequence_length": self.sequence_length,
            "files": [
                [f.path, f.num_tokens * f.itemsize, f.dtype] + ([f.label_mask_path] if f.label_mask_path else [])
                for f in self.files
            ],
            "mix": self._mix_digest(),
        }

    def _mix_digest(self) -> str | None:
        if self.mix is None:
            return None
        # the mix identity holds each selection's sha256, so huge selections need not be hashed again here
        return hashlib.sha256(json.dumps(self.mix, sort_keys=True).encode()).hexdigest()[:16]

    # -- locating instances ----------------------------------------------------------------------------------

    def _check_indices(self, indices: np.ndarray) -> None:
        n = len(self)
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
            bad = int(indices.max()) if int(indices.max()) >= n else int(indices.min())
            raise DataError(
                f"instance index {bad} is out of range: the dataset has {n} instances of "
                f"{self.sequence_length} tokens; was the order built for other data?"
            )

    def base_indices(self, indices: npt.ArrayLike) -> np.ndarray:
        """Instance numbers in the concatenation of all files (what OLMo would call them), through the mix."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._check_indices(idx)
        if self.mix is None:
            return idx
        src = np.searchsorted(self._selection_offsets, idx, side="right") - 1
        out = np.empty_like(idx)
        for s in np.unique(src):
            here = src == s
            local = np.asarray(self._selections[s])[idx[here] - self._selection_offsets[s]]
            out[here] = local + self.file_offsets[self._source_file_ranges[s][0]]
        return out

    def dataset_indices_of(self, base: int) -> list[int]:
        """The reverse of `base_indices`: the dataset indices whose instance is `base` (in the concatenation of
        all files). Without a mix, just `base`; through a mix, none when its source down-sampled it away and
        several when the source repeats it."""
        if self.mix is None:
            return [int(base)]
        out: list[int] = []
        for s, (f_lo, f_hi) in enumerate(self._source_file_ranges):
            lo, hi = int(self.file_offsets[f_lo]), int(self.file_offsets[f_hi])
            if lo <= base < hi:
                picked = np.flatnonzero(np.asarray(self._selections[s]) == base - lo)
                out.extend((picked + int(self._selection_offsets[s])).tolist())
        return out

    def locate_many(self, indices: npt.ArrayLike) -> list[InstanceLocation]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        base = self.base_indices(idx)
        file_idx = np.searchsorted(self.file_offsets, base, side="right") - 1
        offsets = (base - self.file_offsets[file_idx]) * self.sequence_length
        out = []
        for i, b, k, off in zip(idx.tolist(), base.tolist(), file_idx.tolist(), offsets.tolist(), strict=True):
            out.append(InstanceLocation(i, b, k, self.files[k].path, off, self.source_of_file(k)))
        return out

    def locate(self, index: int) -> tuple[str, int]:
        """(token file path, offset of the instance's first token in it)."""
        loc = self.locate_many([index])[0]
        return loc.path, loc.token_offset

    @property
    def source_names(self) -> list[str]:
        """The mix's source names, in instance order (empty without a mix)."""
        return list(self._source_names)

    def source_instances(self, name: str) -> int:
        """How many of the dataset's instances come from mix source `name`."""
        return len(self._selections[self._source_names.index(name)])

    def source_of_file(self, file_index: int) -> str | None:
        """The mix source a file belongs to (None without a mix)."""
        for name, (lo, hi) in zip(self._source_names, self._source_file_ranges, strict=True):
            if lo <= file_index < hi:
                return name
        return None

    # -- reading ---------------------------------------------------------------------------------------------

    def read_tokens(self, path: str, dtype: Any, offset: int, length: int) -> np.ndarray:
        """`length` items of `dtype` at item `offset` of a local or remote headerless little-endian array."""
        return read_arrays([(path, dtype, offset, length)])[0]

    def get_batch(self, indices: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray | None]:
        """Token ids (int64, shape (n, sequence_length)) of the given instances, in the given order, and their
        label masks (bool, same shape; True = train on the token) when any file has one, else None.

        All the batch's reads (tokens and masks) are made in one `read_arrays` call, so remote ones overlap.
        """
        locs = self.locate_many(indices)
        L = self.sequence_length
        files = [self.files[loc.file_index] for loc in locs]
        reads: list[tuple[str, Any, int, int]] = [
            (f.path, DTYPES[f.dtype], loc.token_offset, L) for f, loc in zip(files, locs, strict=True)
        ]
        mask_rows = [row for row, f in enumerate(files) if f.label_mask_path]
        reads += [(files[r].label_mask_path or "", LABEL_MASK_DTYPE, locs[r].token_offset, L) for r in mask_rows]
        arrays = read_arrays(reads)
        tokens = np.empty((len(locs), L), dtype=np.int64)
        for row in range(len(locs)):
            tokens[row] = arrays[row]
        masks = np.ones((len(locs), L), dtype=bool) if self.has_label_masks else None
        if masks is not None:
            for row, mask in zip(mask_rows, arrays[len(locs) :], strict=True):
                masks[row] = mask
        return tokens, masks

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get_batch([index])[0][0]


def dtype_note(dtype: str) -> str:
    """What `inspect-batch` and `stats` print when they read token files as an assumed dtype."""
    return (
        f"note: token files without a manifest read as {dtype} (OLMo's default; no data.dtype or memmap_dtype in "
        "the config): set data.dtype if they hold another"
    )


def read_arrays(reads: Sequence[tuple[str, Any, int, int]]) -> list[np.ndarray]:
    """For each (path, dtype, item offset, items), that slice of a headerless little-endian array file.

    Local files are read with `os.pread`, not a memory map: a page fault on a map makes the kernel read ahead (up
    to megabytes) around every instance, which for scattered instances costs far more than the instance itself
    (measured: 2048 cold 8 KB reads took 8 s through np.memmap, 0.03 s with pread). Remote ones go to
    `olmo_data.remote` in one call, which makes them concurrently, merged where they neighbour, with retries.
    """
    out: list[np.ndarray | None] = [None] * len(reads)
    remote: list[int] = []
    fds: dict[str, int] = {}
    try:
        for i, (path, dtype, offset, length) in enumerate(reads):
            if is_remote(path):
                remote.append(i)
                continue
            dt = np.dtype(dtype).newbyteorder("<")
            try:
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                raw = os.pread(fd, length * dt.itemsize, offset * dt.itemsize)
            except OSError as e:
                raise DataError(f"{path}: cannot read tokens {offset}..{offset + length} ({e})") from e
            if len(raw) != length * dt.itemsize:
                raise DataError(
                    f"{path}: the file ended before token {offset + length}; it shrank after the dataset was opened"
                )
            out[i] = np.frombuffer(raw, dtype=dt)
    finally:
        for fd in fds.values():
            os.close(fd)
    if remote:
        dtypes = [np.dtype(reads[i][1]).newbyteorder("<") for i in remote]
        ranges = [
            (reads[i][0], reads[i][2] * d.itemsize, reads[i][3] * d.itemsize)
            for i, d in zip(remote, dtypes, strict=True)
        ]
        for i, d, raw in zip(remote, dtypes, remote_reader().read_many(ranges), strict=True):
            out[i] = np.frombuffer(raw, dtype=d)
    return out  # type: ignore[return-value]


def open_dataset(
    paths: Sequence[str] | None = None,
    *,
    sequence_length: int,
    label_mask_paths: Sequence[str] | None = None,
    mix: str | None = None,
    dtype: str | None = None,
) -> InstanceSource:
    """Open token files, token directories (expanded via their manifest, in manifest order) or a mix manifest.

    Exactly one of `paths` and `mix` is given. `dtype` is only needed for token files without a manifest
    (OLMo's default is uint16); when a manifest exists, a `dtype` that disagrees with it is an error rather
    than a silent misread. `label_mask_paths` are aligned with the expanded token files, one per file.
    """
    if (paths is None) == (mix is None):
        raise DataError("give either data.paths (token files or directories) or data.mix (a mix manifest), not both")
    if mix is not None:
        return open_mix(mix, sequence_length=sequence_length, dtype=dtype)
    assert paths is not None
    return InstanceSource(token_files(paths, label_mask_paths, dtype, sequence_length), sequence_length)


def open_mix(path: str, *, sequence_length: int, dtype: str | None = None) -> InstanceSource:
    """The instance index of a mix (see `open_dataset(mix=...)`): its checked selections, source after source."""
    mix = load_mix(path, sequence_length=sequence_length, dtype=dtype)
    return InstanceSource(
        mix.files,
        sequence_length,
        mix=mix.identity,
        mix_selections=mix.selections,
        mix_file_ranges=mix.file_ranges,
        mix_path=mix.manifest_path,
    )


def open_from_config(config: TrainConfig | dict[str, Any], *, base_dir: str | None = None) -> InstanceSource:
    """The dataset a training config describes (`model.max_sequence_length` and `data.*`): a run's TrainConfig
    (`olmo_data.config.read_run_config`: what the trainer reads), or a dict of just those keys, which must then
    name both (a program describing data, not a run, gets no defaults).

    Relative local paths are taken relative to `base_dir` when given (the config file's directory is *not*
    used by default, to match the trainer, which resolves them against the working directory).
    """
    if isinstance(config, TrainConfig):
        data: dict[str, Any] = dataclasses.asdict(config.data)
        length: Any = config.model.max_sequence_length
    else:
        data = config.get("data") or {}
        model = config.get("model") or {}
        if "max_sequence_length" not in model:
            raise DataError("config: model.max_sequence_length is missing; it sets the instance length")
        length = model["max_sequence_length"]

    def rel(p: str) -> str:
        p = str(p)
        return p if is_remote(p) or base_dir is None or os.path.isabs(p) else os.path.join(base_dir, p)

    if data.get("mix"):
        return open_dataset(sequence_length=int(length), mix=rel(data["mix"]), dtype=data.get("dtype"))
    if not data.get("paths") and data.get("olmo_core"):
        raise DataError(
            f"config: data.olmo_core ({data['olmo_core']}) names an OLMo-core run's data; this command reads only "
            "data.paths or data.mix (inspect-batch, trace, stats, build-order and spikes read data.olmo_core)"
        )
    if not data.get("paths"):
        raise DataError("config: data.paths is missing or empty (and no data.mix); list token files or directories")
    masks = data.get("label_mask_paths")
    return open_dataset(
        [rel(p) for p in data["paths"]],
        sequence_length=int(length),
        label_mask_paths=[rel(m) for m in masks] if masks else None,
        dtype=data.get("dtype"),
    )
