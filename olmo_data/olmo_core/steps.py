"""Which slice of which epoch's order OLMo-core's training step N reads, batch-size schedule included.

OLMo-core's `NumpyFSLDataLoader` cuts an epoch's order into batches of `global_batch_size // sequence_length`
instances (its global batch size counts tokens), drops the tail that does not fill a batch, and gives data-parallel
rank `r` of `W` the positions `r, r + W, ...` of each batch. Step N (1-based) is the N-th batch the trainer drew.

A `BatchSizeSchedulerCallback` changes the batch size before a batch is drawn (`pre_load_batch`) once the step,
token or epoch count of its next entry is reached: a smaller batch at once, a batch `f` times larger only when the
batches drawn so far in the epoch are a multiple of `f`. The loader rescales its count of batches drawn in the
epoch, so the epoch's order is read on without a gap or an overlap, and an epoch ends when no whole batch of the
size then in force is left (`len // instances_per_batch` batches). This module replays exactly that walk.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from olmo_data.errors import DataError
from olmo_data.olmo_core.config import BatchSizeChange


@dataclass(frozen=True)
class StepSlot:
    """Where training step `step` read: batch `batch` (0-based, in batches of `instances` instances) of epoch
    `epoch` (1-based, as OLMo-core numbers it), i.e. positions `start .. start + instances` of that epoch's order."""

    step: int
    epoch: int
    batch: int
    instances: int  # instances per global batch at this step
    tokens_before: int  # tokens trained before this step (OLMo-core's global_train_tokens_seen)

    @property
    def start(self) -> int:
        return self.batch * self.instances


class StepWalk:
    """Step N -> `StepSlot`, for a dataset of `dataset_size` instances of `sequence_length` tokens.

    Without a schedule this is arithmetic; with one, steps are replayed from 1 (each costs a few microseconds),
    and the slots of one walk are kept so asking again, or for a later step, does not start over.
    """

    def __init__(
        self,
        dataset_size: int,
        sequence_length: int,
        global_batch_size: int,
        schedule: tuple[BatchSizeChange, ...] = (),
    ) -> None:
        self.dataset_size = int(dataset_size)
        self.sequence_length = int(sequence_length)
        self.global_batch_size = int(global_batch_size)
        self.schedule = tuple(schedule)
        for tokens in [self.global_batch_size] + [c.tokens for c in self.schedule]:
            if tokens // self.sequence_length > self.dataset_size:
                raise DataError(
                    f"a global batch of {tokens} tokens ({tokens // self.sequence_length} instances) is larger than "
                    f"the dataset ({self.dataset_size} instances of {self.sequence_length} tokens): OLMo-core would "
                    "train no batch"
                )
        self._slots: list[StepSlot] = []
        self._keys: list[tuple[int, int]] = []  # (epoch, first position) of each slot, for bisect
        self._walker: Iterator[StepSlot] | None = None

    def batches_per_epoch(self, tokens: int | None = None) -> int:
        """Batches in an epoch at a batch of `tokens` tokens (the configured size when None)."""
        per_batch = (tokens or self.global_batch_size) // self.sequence_length
        return self.dataset_size // per_batch

    def slot(self, step: int) -> StepSlot:
        if step < 1:
            raise DataError(f"training steps count from 1, got step {step}")
        if not self.schedule:
            per_batch = self.global_batch_size // self.sequence_length
            n = self.batches_per_epoch()
            return StepSlot(step, (step - 1) // n + 1, (step - 1) % n, per_batch, (step - 1) * self.global_batch_size)
        if self._walker is None:
            self._walker = self._walk()
        while len(self._slots) < step:
            slot = next(self._walker)
            self._slots.append(slot)
            self._keys.append((slot.epoch, slot.start))
        return self._slots[step - 1]

    def _walk(self) -> Iterator[StepSlot]:
        """OLMo-core's Trainer and loader, step by step: the schedule applied before each batch is drawn."""
        L = self.sequence_length
        gbs = self.global_batch_size
        epoch, drawn, step, tokens = 1, 0, 0, 0
        while True:
            gbs, drawn = self._apply(gbs, drawn, step, tokens, epoch)
            per_batch = gbs // L
            if drawn >= self.dataset_size // per_batch:  # the epoch is over: the next one starts, schedule again
                epoch, drawn = epoch + 1, 0
                continue
            step += 1
            yield StepSlot(step, epoch, drawn, per_batch, tokens)
            drawn += 1
            tokens += gbs

    def _apply(self, gbs: int, drawn: int, step: int, tokens: int, epoch: int) -> tuple[int, int]:
        """`BatchSizeSchedulerCallback._maybe_update_batch_size_and_lr` and the loader's batch-size setter."""
        for change in reversed(self.schedule):
            due = {"steps": step, "tokens": tokens}.get(change.unit)
            if (epoch > change.start) if due is None else (due >= change.start):
                target = change.tokens
                if target > gbs:
                    ratio = target // gbs
                    if drawn % ratio == 0:
                        return target, drawn // ratio
                elif target < gbs:
                    return target, drawn * (gbs // target)
                break
        return gbs, drawn

    def steps_of(self, epoch: int, position: int, last_step: int) -> list[int]:
        """The step (at most one) up to `last_step` that read position `position` of epoch `epoch`'s order."""
        if not self.schedule:
            per_batch = self.global_batch_size // self.sequence_length
            n = self.batches_per_epoch()
            batch = position // per_batch
            step = (epoch - 1) * n + batch + 1
            return [step] if batch < n and step <= last_step else []
        if last_step < 1:
            return []
        self.slot(last_step)  # walked that far: slots are in (epoch, start) order, so search them
        i = bisect.bisect_right(self._keys, (epoch, position), 0, last_step) - 1
        if i >= 0:
            slot = self._slots[i]
            if slot.epoch == epoch and slot.start <= position < slot.start + slot.instances:
                return [slot.step]
        return []
