"""OLMo-core's data orders: its permutation, its order files, found where it writes them or rebuilt.

`NumpyFSLDataLoader` numbers epochs from 1 (`Trainer.epoch` starts at 1; `reshuffle` refuses epoch 0), and the
order of epoch `e` is `np.random.Generator(np.random.PCG64(seed + e))` shuffling `np.arange(N, dtype=uint32)`.
So OLMo-core's first epoch is our `build_order(N, seed, epoch=1)`: the same permutation one epoch later.

With `max_target_sequence_length` (chunk size `k = max_target_sequence_length // sequence_length` > 1) it
shuffles the `N // k` chunk numbers instead and expands chunk `c` to instances `c*k, ..., c*k + k - 1`, so runs
of `k` neighbouring instances stay together (and a tail of fewer than `k` instances is never trained).

It writes each epoch's order, headerless uint32, as `global_indices_[chunk{k}_]dataset_size{N}_epoch{e}_seed{s}
_v1.npy` (its fields in sorted order, `chunk` only when k > 1) in the data loader's work_dir.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from olmo_data.errors import DataError
from olmo_data.io import atomic_path


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

    def _refuse(self, position: int, value: int) -> None:
        raise DataError(order_refusal(str(self.path), self.epoch, self.size, past(position, value, self.size)))


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
    """Epoch `epoch`'s order: OLMo-core's file in `work_dir` when it is there (mapped, not read: a large run's
    orders are gigabytes; checked as `EpochOrder` says), else rebuilt by the same rule, and the note says which."""
    path = os.path.join(work_dir, order_file_name(dataset_size, epoch, seed, chunk_size))
    length = dataset_size // chunk_size * chunk_size
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
        if size != 4 * length:
            raise DataError(
                f"{path}: {size:,} bytes, but OLMo-core's order of epoch {epoch} over {dataset_size:,} instances "
                f"is {length:,} uint32 numbers ({4 * length:,} bytes); the file is truncated or not OLMo-core's"
            )
        try:
            stored = np.memmap(path, dtype="<u4", mode="r") if length else np.zeros(0, dtype=np.uint32)
        except OSError as e:
            raise DataError(f"{path}: cannot read OLMo-core's order of epoch {epoch} ({e})") from e
        sample_check(path, stored, length, epoch, chunk_size)
        return EpochOrder(epoch, stored, path, f"read from {path}", length)
    order = build_olmo_core_order(dataset_size, seed, epoch, chunk_size)
    return EpochOrder(epoch, order, None, f"rebuilt ({path} not found)", length)


def write_olmo_core_order(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> str:
    """Write epoch `epoch`'s order into `work_dir` under OLMo-core's name, atomically (for `build-order`): the
    bytes OLMo-core writes, so an OLMo-core loader pointed at this work_dir uses it as its own."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, order_file_name(dataset_size, epoch, seed, chunk_size))
    with atomic_path(path) as tmp:
        build_olmo_core_order(dataset_size, seed, epoch, chunk_size).astype("<u4").tofile(tmp)
    return path
