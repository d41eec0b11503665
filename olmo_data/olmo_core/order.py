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
from dataclasses import dataclass

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


@dataclass(frozen=True)
class EpochOrder:
    """An epoch's order and where it came from: OLMo-core's own file, or rebuilt here (and why)."""

    epoch: int
    order: np.ndarray
    path: str | None  # OLMo-core's file, when it was found
    note: str  # said to the user: "read from ..." or "rebuilt (... not found)"


def olmo_core_order(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> EpochOrder:
    """Epoch `epoch`'s order: OLMo-core's file in `work_dir` when it is there (mapped, not read: a large run's
    orders are gigabytes), else rebuilt by the same rule, and the note says which."""
    path = os.path.join(work_dir, order_file_name(dataset_size, epoch, seed, chunk_size))
    if os.path.isfile(path):
        length = dataset_size // chunk_size * chunk_size
        if os.path.getsize(path) != 4 * length:
            raise DataError(
                f"{path}: {os.path.getsize(path)} bytes, but OLMo-core's order of epoch {epoch} over "
                f"{dataset_size} instances is {length} uint32 numbers; the file is truncated or not OLMo-core's"
            )
        stored = np.memmap(path, dtype="<u4", mode="r") if length else np.zeros(0, dtype=np.uint32)
        return EpochOrder(epoch, stored, path, f"read from {path}")
    order = build_olmo_core_order(dataset_size, seed, epoch, chunk_size)
    return EpochOrder(epoch, order, None, f"rebuilt ({path} not found)")


def write_olmo_core_order(work_dir: str, dataset_size: int, seed: int, epoch: int, chunk_size: int = 1) -> str:
    """Write epoch `epoch`'s order into `work_dir` under OLMo-core's name, atomically (for `build-order`): the
    bytes OLMo-core writes, so an OLMo-core loader pointed at this work_dir uses it as its own."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, order_file_name(dataset_size, epoch, seed, chunk_size))
    with atomic_path(path) as tmp:
        build_olmo_core_order(dataset_size, seed, epoch, chunk_size).astype("<u4").tofile(tmp)
    return path
