"""OLMo-core's data orders: its permutation, its order files, found where it writes them or rebuilt.

`NumpyFSLDataLoader` numbers epochs from 1 (`Trainer.epoch` starts at 1; `reshuffle` refuses epoch 0), and the
order of epoch `e` is `np.random.Generator(np.random.PCG64(seed + e))` shuffling `np.arange(N, dtype=uint32)`.
So OLMo-core's first epoch is our `build_order(N, seed, epoch=1)`: the same permutation one epoch later.

With `max_target_sequence_length` (chunk size `k = max_target_sequence_length // sequence_length` > 1) it
shuffles the `N // k` chunk numbers instead and expands chunk `c` to instances `c*k, ..., c*k + k - 1`, so runs
of `k` neighbouring instances stay together (and a tail of fewer than `k` instances is never trained).

It writes each epoch's order, headerless uint32, as `global_indices_[chunk{k}_]dataset_size{N}_epoch{e}_seed{s}
_v1.npy` (its fields in sorted order, `chunk` only when k > 1) in the data loader's work_dir.

A run's work_dir names the training cluster's folder (`/weka/...`), absent where the run is inspected; its order
files are given with `--order`: a local folder or a URL (the folder they were copied to, or one of the files,
whose folder then holds the others). A remote order file is read by ranges, never whole, for what a step needs
(`RemoteOrderFile`): at OLMo 3's scale it is 2.9 GB and a batch's slice 2 KiB.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from olmo_data.dataset import already_verified, remember_verified, search_order_file, verified_marker
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, cached_download, default_cache_dir, is_remote
from olmo_data.remote import remote_reader, stat_many


def order_file_name(dataset_size: int, epoch: int, seed: int, chunk_size: int = 1) -> str:
    """The name OLMo-core gives an epoch's order (`NumpyFSLDataLoader._global_indices_file`)."""
    fields = {
        "seed": seed,
        "epoch": epoch,
        "dataset_size": dataset_size,
        "chunk": chunk_size if chunk_size > 1 else None,
    }
    parts = ["global_indices"] + [f"{k}{fields[k]}" for k in sorted(fields) if fields[k] is not None] + ["v1"]
    return "_".join(parts) + ".npy"


def build_olmo_core_order(dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> np.ndarray:
    """The order of OLMo-core's epoch `epoch` (1-based) over `dataset_size` instances, as uint32."""
    if epoch < 1:
        raise DataError(f"OLMo-core numbers epochs from 1, got epoch {epoch}")
    if dataset_size >= np.iinfo(np.uint32).max:
        raise DataError(f"{dataset_size} instances do not fit OLMo-core's uint32 orders")
    rng = np.random.Generator(np.random.PCG64(seed + epoch))
    if chunk_size == 1:
        order = np.arange(dataset_size, dtype=np.uint32)
        rng.shuffle(order)
        return order
    chunks = np.arange(dataset_size // chunk_size, dtype=np.uint32)
    rng.shuffle(chunks)
    return (chunks[:, None] * chunk_size + np.arange(chunk_size, dtype=np.uint32)[None, :]).reshape(-1)


SAMPLE_BLOCKS = 16  # blocks of an order file checked when it is opened (its first, its last, evenly between)
SAMPLE_ENTRIES = 1024  # entries a block (4 KiB)


@dataclass
class EpochOrder:
    """An epoch's order and where it came from: OLMo-core's own file, or rebuilt here (and why).

    A file is what OLMo-core trained on, so it is read, not rebuilt, but never trusted: its size is checked, a
    sample of its blocks when it is opened, every entry a command reads (`entries`), and all of it when a command
    reads it whole (`whole`). A file of another dtype, another dataset or damaged bytes names other instances at
    every step; each check refuses it naming the file and the entry."""

    epoch: int
    order: np.ndarray
    path: str | None  # OLMo-core's file, when it was found
    note: str  # said to the user: "read from ..." or "rebuilt (... not found)"
    size: int = 0  # instances of the dataset the order is over (its entries are 0 .. size - 1)
    _whole: np.ndarray | None = field(default=None, repr=False)

    def entries(self, start: int, stop: int) -> np.ndarray:
        """Entries `start .. stop` (as int64), each checked to be an instance of the dataset when read from a file."""
        out = np.asarray(self.order[start:stop], dtype=np.int64)
        if self.path is not None and out.size and int(out.max()) >= self.size:
            self._refuse(start + int(np.argmax(out >= self.size)), int(out.max()))
        return out

    def whole(self) -> np.ndarray:
        """The whole order, a file's checked to be a permutation of the dataset's instances (each once)."""
        if self._whole is None:
            order = np.asarray(self.order)
            if self.path is not None:
                check_permutation(self.path, order, self.size, self.epoch)
            self._whole = order
        return self._whole

    def positions_of(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, entries) of the order holding one of the instances `wanted`. A file's order is read a block
        at a time (`search_order_file`: never mapped whole, an epoch is 2.9 GB at OLMo 3's scale and a trace
        reaches two), and checked to be a permutation in the same pass, once: the verdict is kept by the file's
        path, size and mtime (`verified_marker`), so a repeated trace only searches."""
        if self.path is None or self._whole is not None:
            return positions_in(self.whole(), wanted)
        local = self.order.local_copy() if isinstance(self.order, RemoteOrderFile) else self.path
        marker = verified_marker(local)
        if already_verified(marker):
            return search_order_file(local, np.dtype("<u4"), 0, len(self.order), wanted)
        seen = np.zeros(self.size, dtype=bool)

        def check(block: np.ndarray, lo: int) -> None:
            if block.size and int(block.max()) >= self.size:
                self._refuse(lo + int(np.argmax(block >= self.size)), int(block.max()))
            seen[block] = True

        found = search_order_file(local, np.dtype("<u4"), 0, len(self.order), wanted, check)
        if not seen.all():
            detail = f"instance {int(np.argmin(seen)):,} is not in it (another entry holds an instance twice)"
            raise DataError(order_refusal(str(self.path), self.epoch, self.size, detail))
        remember_verified(marker)
        return found

    def _refuse(self, position: int, value: int) -> None:
        raise DataError(order_refusal(str(self.path), self.epoch, self.size, past(position, value, self.size)))


def positions_in(order: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, entries as int64) of an order in memory holding one of the instances `wanted`."""
    at = np.flatnonzero(np.isin(order, wanted))
    return at, np.asarray(order[at], dtype=np.int64)


def past(position: int, value: int, size: int) -> str:
    return f"entry {position:,} is instance {value:,}, past the dataset's {size:,} instances"


def order_refusal(path: str, epoch: int, size: int, detail: str) -> str:
    """The one line an order file with a wrong entry gets: the file, the entry, and what it should hold."""
    return (
        f"{path}: {detail}; OLMo-core's order of epoch {epoch} holds each of instances 0..{size - 1:,} once: the "
        "file is not this run's order (another dtype, another dataset, or damaged); remove it to rebuild it, or "
        "point --order / data_loader.work_dir at the run's own"
    )


def check_permutation(path: str, order: np.ndarray, size: int, epoch: int) -> None:
    """Every entry of `order` (read from `path`) is an instance number below `size`, none twice: bounded by one
    byte per instance beside the order itself."""
    if order.size and int(order.max()) >= size:
        position = int(np.argmax(order >= size))
        raise DataError(order_refusal(path, epoch, size, past(position, int(order[position]), size)))
    seen = np.zeros(size, dtype=bool)
    seen[order] = True
    if not seen.all():
        missing = int(np.argmin(seen))
        detail = f"instance {missing:,} is not in it (another entry holds an instance twice)"
        raise DataError(order_refusal(path, epoch, size, detail))


def sample_check(path: str, order: np.ndarray, size: int, epoch: int, chunk_size: int) -> None:
    """A few blocks of an order file (its first, its last, evenly between) checked when it is opened, so that a
    file of another dtype or zeroed bytes is refused by every command that reads it, at a cost that does not grow
    with the file: entries below `size`, no entry twice in the sample, each chunk a run of consecutive numbers."""
    n = len(order)
    if n == 0:
        return
    block = max(chunk_size, SAMPLE_ENTRIES // chunk_size * chunk_size)
    starts = np.unique(np.linspace(0, max(0, n - block), SAMPLE_BLOCKS).astype(np.int64) // chunk_size * chunk_size)
    positions = np.unique(np.concatenate([lo + np.arange(min(block, n - lo)) for lo in starts.tolist()]))
    values = np.asarray(order[positions], dtype=np.int64)
    if int(values.max()) >= size:
        i = int(np.argmax(values >= size))
        raise DataError(order_refusal(path, epoch, size, past(int(positions[i]), int(values[i]), size)))
    if chunk_size > 1:  # whole chunks were sampled: each a run counting up by one from a multiple of its size
        runs = values.reshape(-1, chunk_size)
        broken = np.flatnonzero((runs[:, 0] % chunk_size != 0) | (np.diff(runs, axis=1) != 1).any(axis=1))
        if broken.size:
            i = int(broken[0]) * chunk_size
            detail = f"entry {int(positions[i]):,} starts a chunk of {chunk_size} not of consecutive instances"
            raise DataError(order_refusal(path, epoch, size, detail))
    unique, first = np.unique(values, return_index=True)
    if len(unique) != len(values):
        i = int(np.setdiff1d(np.arange(len(values)), first, assume_unique=True)[0])
        detail = f"entry {int(positions[i]):,} is instance {int(values[i]):,} again"
        raise DataError(order_refusal(path, epoch, size, detail))


def olmo_core_order(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> EpochOrder:
    """Epoch `epoch`'s order: OLMo-core's file in `work_dir` (a folder, a URL, or one of its order files) when it
    is there (mapped, or read by ranges when remote, never read whole: a large run's orders are gigabytes; checked
    as `EpochOrder` says), else rebuilt by the same rule, and the note says which."""
    name = order_file_name(dataset_size, epoch, seed, chunk_size)
    path = order_path(work_dir, name, dataset_size, seed, chunk_size)
    length = dataset_size // chunk_size * chunk_size
    if is_remote(path):
        return _remote_order(path, length, dataset_size, seed, epoch, chunk_size)
    if os.path.isdir(path):
        raise DataError(
            f"{path}: a directory where OLMo-core's order of epoch {epoch} belongs; remove it, or point --order "
            "at the run's work_dir"
        )
    if os.path.lexists(path):
        try:
            size = os.path.getsize(path)
        except OSError as e:  # a dangling link, a file without permission
            raise DataError(f"{path}: cannot read OLMo-core's order of epoch {epoch} ({e})") from e
        _check_size(path, size, length, dataset_size, epoch)
        try:
            stored = np.memmap(path, dtype="<u4", mode="r") if length else np.zeros(0, dtype=np.uint32)
        except OSError as e:
            raise DataError(f"{path}: cannot read OLMo-core's order of epoch {epoch} ({e})") from e
        sample_check(path, stored, length, epoch, chunk_size)
        return EpochOrder(epoch, stored, path, f"read from {path}", length)
    return rebuilt_order(path, dataset_size, seed, epoch, chunk_size)


def olmo_core_order_note(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> str:
    """What `olmo_core_order` says of the epoch's order (where it is read from, or that it is rebuilt), found
    without reading or rebuilding it: `stats` names each epoch's order, and rebuilding an epoch of OLMo 3's
    pretraining to say so took 98 s. A file there is opened as every command opens it, and refused alike."""
    name = order_file_name(dataset_size, epoch, seed, chunk_size)
    path = order_path(work_dir, name, dataset_size, seed, chunk_size)
    there = _remote_size(path) is not None if is_remote(path) else os.path.lexists(path)
    if there:  # opened as every command opens it (sized, a sample checked), never read whole
        return olmo_core_order(work_dir, dataset_size, seed, epoch, chunk_size).note
    kept = _kept_copy(dataset_size, seed, epoch, chunk_size)
    return f"rebuilt ({path} not found; kept in {kept})" if kept else f"rebuilt ({path} not found)"


KEEP_REBUILT_FROM = 1 << 24  # instances: a smaller order is rebuilt in under a second and not kept


def kept_order_path(dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> str:
    """Where a rebuilt order is kept on this machine: `<cache>/olmo-core-orders/` under OLMo-core's own name,
    which holds everything the order depends on (instances, epoch, seed, chunk), so it never goes stale."""
    name = order_file_name(dataset_size, epoch, seed, chunk_size)
    return os.path.join(default_cache_dir(), "olmo-core-orders", name)


def _kept_copy(dataset_size: int, seed: int, epoch: int, chunk_size: int) -> str | None:
    """The kept copy of a rebuilt order, when the order is large enough to keep and a file of its size is there."""
    kept = kept_order_path(dataset_size, seed, epoch, chunk_size)
    length = dataset_size // chunk_size * chunk_size
    if dataset_size >= KEEP_REBUILT_FROM and os.path.isfile(kept) and os.path.getsize(kept) == 4 * length:
        return kept
    return None


def rebuilt_order(missing: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> EpochOrder:
    """The order OLMo-core's rule gives, where its file (`missing`) is not there. A large one (an epoch of OLMo
    3's pretraining is 730M instances: 2.9 GB, a minute or more to shuffle) is kept in the cache once built and
    mapped from there by later commands (a repeated `inspect-batch` then answers in about a second); the cache
    may be cleared at any time, and a damaged copy is rebuilt over. One that cannot be written (a full disk) is
    not kept, without failing."""
    length = dataset_size // chunk_size * chunk_size
    if (kept := _kept_copy(dataset_size, seed, epoch, chunk_size)) is not None:
        stored = np.memmap(kept, dtype="<u4", mode="r")
        try:
            sample_check(kept, stored, length, epoch, chunk_size)
            return EpochOrder(epoch, stored, None, f"rebuilt ({missing} not found; kept in {kept})", length)
        except DataError:
            del stored  # damaged in the cache: rebuilt over it below
    order = build_olmo_core_order(dataset_size, seed, epoch, chunk_size)
    note = f"rebuilt ({missing} not found)"
    if dataset_size >= KEEP_REBUILT_FROM:
        kept = kept_order_path(dataset_size, seed, epoch, chunk_size)
        try:
            with atomic_path(kept) as tmp:
                order.astype("<u4", copy=False).tofile(tmp)
            note = f"rebuilt ({missing} not found; kept in {kept} for later commands)"
        except OSError:
            pass
    return EpochOrder(epoch, order, None, note, length)


def order_path(location: str, name: str, dataset_size: int, seed: int, chunk_size: int = 1) -> str:
    """Where the order file `name` is, given a folder (local or a URL) or one of the run's order files (an
    `.npy` named as OLMo-core names this run's orders, of any epoch: the others lie beside it). A file of another
    name is refused: it is another run's order, or renamed, and would be passed over without a word."""
    remote = is_remote(location)
    if not location.endswith(".npy"):
        return f"{location.rstrip('/')}/{name}" if remote else os.path.join(location, name)
    folder, given = location.rpartition("/")[::2] if remote else os.path.split(location)
    head, _, tail = order_file_name(dataset_size, 1, seed, chunk_size).partition("_epoch1_")
    if not re.fullmatch(re.escape(head) + r"_epoch\d+_" + re.escape(tail), given):
        raise DataError(
            f"{location}: not one of this run's order files, which OLMo-core names {name} (epoch 1: "
            f"{head}_epoch1_{tail}, for {dataset_size:,} instances and seed {seed}); give the folder they were "
            "copied to, or one of them under its own name"
        )
    return f"{folder}/{name}" if remote else os.path.join(folder or ".", name)


def _check_size(path: str, size: int, length: int, dataset_size: int, epoch: int) -> None:
    if size != 4 * length:
        raise DataError(
            f"{path}: {size:,} bytes, but OLMo-core's order of epoch {epoch} over {dataset_size:,} instances "
            f"is {length:,} uint32 numbers ({4 * length:,} bytes); the file is truncated or not OLMo-core's"
        )


def _remote_size(path: str) -> int | None:
    """A remote order file's size (one HEAD, kept in the disk cache as every remote size), None when absent."""
    root = default_cache_dir() if path.startswith(("s3://", "http://", "https://")) else None
    return stat_many(remote_reader(), [path], root)[path].size


def _remote_order(path: str, length: int, dataset_size: int, seed: int, epoch: int, chunk_size: int) -> EpochOrder:
    """A remote order file, sized (one HEAD, cached as every remote size) and sampled by ranges; absent (404):
    rebuilt. Its absence is not kept in the disk cache, so an order copied there later is used at once."""
    size = _remote_size(path)
    if size is None:
        return rebuilt_order(path, dataset_size, seed, epoch, chunk_size)
    _check_size(path, size, length, dataset_size, epoch)
    stored = RemoteOrderFile(path, length)
    sample_check(path, stored, length, epoch, chunk_size)  # type: ignore[arg-type]
    return EpochOrder(epoch, stored, path, f"read from {path} (by ranges)", length)  # type: ignore[arg-type]


class RemoteOrderFile:
    """An order file in object storage as an array of uint32, read by ranges: a slice is one ranged read, a list
    of positions one read per run of neighbouring ones (all in flight together, through the process's remote
    reader). Only a command that walks the whole order (`np.asarray`: trace's search, a permutation check) fetches
    it whole, once, into the cache (`olmo_data.io.cached_download`: `<cache>/downloads`, reused while the file keeps
    its size), and maps it from there."""

    dtype = np.dtype("<u4")
    ndim = 1

    def __init__(self, url: str, length: int) -> None:
        self.url, self.length = url, length
        self._whole: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    def __getitem__(self, key: Any) -> Any:
        if self._whole is not None:
            return self._whole[key]
        if isinstance(key, slice):
            start, stop, step = key.indices(self.length)
            if step < 0:
                return np.asarray(self)[key]
            return self._read(start, max(start, stop))[::step]
        if isinstance(key, (int, np.integer)):
            at = int(key) + (self.length if key < 0 else 0)
            if not 0 <= at < self.length:
                raise IndexError(f"entry {int(key)} of an order of {self.length} entries")
            return self._read(at, at + 1)[0]
        positions = np.asarray(key, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"entries past an order of {self.length} entries")
        wanted = np.unique(positions)
        breaks = np.flatnonzero(np.diff(wanted) != 1) + 1
        runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(wanted, breaks)] if wanted.size else []
        blocks = remote_reader().read_many([(self.url, 4 * lo, 4 * (hi - lo)) for lo, hi in runs])
        values = np.frombuffer(b"".join(blocks), dtype=self.dtype)
        return values[np.searchsorted(wanted, positions)].astype(np.uint32)

    def _read(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, dtype=np.uint32)
        raw = remote_reader().read(self.url, 4 * start, 4 * (stop - start))
        return np.frombuffer(raw, dtype=self.dtype).astype(np.uint32)

    def local_copy(self) -> str:
        """The whole file's copy in the cache, downloaded once (in ranged chunks) on first use."""
        return str(cached_download(self.url, f"{4 * self.length}"))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._whole is None:
            local = self.local_copy()
            self._whole = np.memmap(local, dtype=self.dtype, mode="r") if self.length else np.zeros(0, np.uint32)
        return self._whole if dtype is None else self._whole.astype(dtype)


def write_olmo_core_order(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> str:
    """Write epoch `epoch`'s order into `work_dir` under OLMo-core's name, atomically (for `build-order`): the
    bytes OLMo-core writes, so an OLMo-core loader pointed at this work_dir uses it as its own."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, order_file_name(dataset_size, epoch, seed, chunk_size))
    with atomic_path(path) as tmp:
        build_olmo_core_order(dataset_size, seed, epoch, chunk_size).astype("<u4", copy=False).tofile(tmp)
    return path
