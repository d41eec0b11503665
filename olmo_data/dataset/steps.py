"""Step arithmetic: which epoch and batch a training step reads, which positions of it a rank trains, and how
many steps a run trains. OLMo's rules: step N (1-based) trains global batch N - 1, counted across epochs of
`num_instances // global_batch_size` full batches; rank r of W takes positions r, r+W, ... of each global batch.

Every step count of the project comes from here (`run_steps`): the trainer's length, `inspect-batch`'s
"of N steps", `trace`'s steps to look at, `lineage`'s planned steps and `stats`' epochs, so none can drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from olmo_data.config import TrainConfig, duration_steps
from olmo_data.errors import DataError


@dataclass(frozen=True)
class BatchPosition:
    """Where a global batch sits in the data: `global_batch` counts across epochs (= step - 1)."""

    global_batch: int
    epoch: int
    batch_in_epoch: int
    batches_per_epoch: int

    @property
    def step(self) -> int:
        return self.global_batch + 1

    def order_range(self, global_batch_size: int) -> tuple[int, int]:
        """[start, stop) of this batch in its epoch's order."""
        return self.batch_in_epoch * global_batch_size, (self.batch_in_epoch + 1) * global_batch_size


def batches_per_epoch(num_instances: int, global_batch_size: int) -> int:
    """Full global batches in one pass over the data (OLMo drops the tail that does not fill one)."""
    if global_batch_size <= 0:
        raise DataError(f"global_train_batch_size must be positive, got {global_batch_size}")
    return num_instances // global_batch_size


def batch_position(global_batch: int, global_batch_size: int, num_instances: int) -> BatchPosition:
    """Epoch and batch-in-epoch of 0-based global batch `global_batch` (what `--batch-index` names)."""
    if global_batch < 0:
        raise DataError(f"batch index must be >= 0, got {global_batch}")
    per_epoch = batches_per_epoch(num_instances, global_batch_size)
    if per_epoch == 0:
        raise DataError(
            f"the data has {num_instances} instances, fewer than one global batch of {global_batch_size}; "
            "add data or lower global_train_batch_size"
        )
    return BatchPosition(global_batch, global_batch // per_epoch, global_batch % per_epoch, per_epoch)


def step_position(step: int, global_batch_size: int, num_instances: int) -> BatchPosition:
    """Epoch and batch-in-epoch of 1-based training step `step` (it trains global batch step - 1)."""
    if step < 1:
        raise DataError(f"training steps count from 1 (step N trains batch N-1), got step {step}")
    return batch_position(step - 1, global_batch_size, num_instances)


def rank_slice(batch: np.ndarray, rank: int, world_size: int, blocks: bool = False) -> np.ndarray:
    """The part of a global batch that rank `rank` of `world_size` trains on: positions rank, rank+W, ...

    This is OLMo's strided split (OLMo-core's FSL loaders split alike); each position goes to exactly one rank,
    and the per-rank batch size is GBS / W, so W must divide the global batch size. With `blocks` (OLMo-core's
    VSL loader), rank r takes the r-th of W consecutive blocks instead.
    """
    if world_size <= 0 or not 0 <= rank < world_size:
        raise DataError(f"rank must be in [0, world size), got rank {rank} of world size {world_size}")
    if len(batch) % world_size:
        raise DataError(
            f"world size {world_size} does not divide the global batch size {len(batch)}; each rank must get "
            "the same number of instances"
        )
    if blocks:
        per = len(batch) // world_size
        return batch[rank * per : (rank + 1) * per]
    return batch[rank::world_size]


def rank_positions(global_batch_size: int, rank: int, world_size: int) -> np.ndarray:
    """Positions in the global batch of rank `rank`'s instances (see `rank_slice`)."""
    return rank_slice(np.arange(global_batch_size), rank, world_size)


def run_steps(config: TrainConfig, num_instances: int) -> int:
    """The steps a run trains (its max_duration in steps, as the trainer counts them): steps as given, tokens
    rounded up to whole steps, epochs as full batches (at least one step). `stop_at` only pauses a run."""
    gbs = config.global_train_batch_size
    return duration_steps(
        config.max_duration,
        global_batch_size=gbs,
        sequence_length=config.model.max_sequence_length,
        batches_per_epoch=batches_per_epoch(num_instances, gbs),
    )
