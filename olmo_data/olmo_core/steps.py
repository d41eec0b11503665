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
from olmo_data.olmo_core.config import MAX_EPOCHS, BatchSizeChange


class PastEpochs(DataError):
    """A step the batch-size schedule's replay would reach only past MAX_EPOCHS epochs (it is not walked)."""


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


@dataclass(frozen=True)
class Segment:
    """Steps `first_step .. first_step + count - 1` read batches `first_batch ..` of epoch `epoch`, each of
    `instances` instances (`tokens_before` tokens trained before the first): a stretch with no schedule event."""

    first_step: int
    count: int
    epoch: int
    first_batch: int
    instances: int
    tokens_before: int

    def slot(self, step: int, sequence_length: int) -> StepSlot:
        k = step - self.first_step
        tokens = self.tokens_before + k * self.instances * sequence_length
        return StepSlot(step, self.epoch, self.first_batch + k, self.instances, tokens)


class StepWalk:
    """Step N -> `StepSlot`, for a dataset of `dataset_size` instances of `sequence_length` tokens.

    Without a schedule this is arithmetic. With one, the run is replayed as stretches of steps between schedule
    events (a change coming due, a waiting increase becoming possible, an epoch's end), each a `Segment`, kept so
    that asking again or further does not start over; a step or a position is then found by bisection.
    """

    def __init__(
        self,
        dataset_size: int,
        sequence_length: int,
        global_batch_size: int,
        schedule: tuple[BatchSizeChange, ...] = (),
        source: str = "config",
    ) -> None:
        self.source = source  # the config file, for messages
        self.dataset_size = int(dataset_size)
        self.sequence_length = int(sequence_length)
        self.global_batch_size = int(global_batch_size)
        self.schedule = tuple(schedule)
        for tokens in [self.global_batch_size] + [c.tokens for c in self.schedule]:
            if tokens // self.sequence_length > self.dataset_size:
                raise DataError(
                    f"{source}: a global batch of {tokens} tokens ({tokens // self.sequence_length} instances) is "
                    f"larger than the dataset ({self.dataset_size} instances of {self.sequence_length} tokens): "
                    "OLMo-core would train no batch"
                )
        self._segments: list[Segment] = []
        self._starts: list[int] = []  # first step of each segment
        self._keys: list[tuple[int, int]] = []  # (epoch, first position) of each segment
        self._walker: Iterator[Segment] | None = None
        self._end: PastEpochs | None = None  # where the replay stopped, when it did

    def batches_per_epoch(self, tokens: int | None = None) -> int:
        """Batches in an epoch at a batch of `tokens` tokens (the configured size when None)."""
        per_batch = (tokens or self.global_batch_size) // self.sequence_length
        return self.dataset_size // per_batch

    def rank_of(self, within: int, instances: int, world_size: int) -> int:
        """The data-parallel rank that got position `within` of a batch of `instances`: every W-th is one rank's."""
        return within % world_size

    def _walk_to(self, step: int) -> None:
        if self._walker is None:
            self._walker = self._walk()
        while not self._segments or self._segments[-1].first_step + self._segments[-1].count <= step:
            if self._end is not None:  # the replay stopped at MAX_EPOCHS: every later step is past it too
                raise self._end
            try:
                seg = next(self._walker)
            except PastEpochs as e:
                self._end = e
                raise
            self._segments.append(seg)
            self._starts.append(seg.first_step)
            self._keys.append((seg.epoch, seg.first_batch * seg.instances))

    def slot(self, step: int) -> StepSlot:
        if step < 1:
            raise DataError(f"training steps count from 1, got step {step}")
        if not self.schedule:
            per_batch = self.global_batch_size // self.sequence_length
            n = self.batches_per_epoch()
            return StepSlot(step, (step - 1) // n + 1, (step - 1) % n, per_batch, (step - 1) * self.global_batch_size)
        self._walk_to(step)
        return self._segments[bisect.bisect_right(self._starts, step) - 1].slot(step, self.sequence_length)

    def _walk(self) -> Iterator[Segment]:
        """OLMo-core's Trainer and loader: the schedule applied before each batch is drawn; between two moments
        where that can change anything, steps go on in one stretch."""
        L = self.sequence_length
        gbs = self.global_batch_size
        epoch, drawn, step, tokens = 1, 0, 0, 0
        while True:
            gbs, drawn = self._apply(gbs, drawn, step, tokens, epoch)
            per_batch = gbs // L
            left = self.dataset_size // per_batch - drawn
            if left <= 0:  # the epoch is over: the next one starts, and the schedule is asked again
                epoch, drawn = epoch + 1, 0
                if epoch > MAX_EPOCHS + 1:  # one past the last: a run of MAX_EPOCHS epochs ends there
                    raise PastEpochs(
                        f"{self.source}: trainer.callbacks' batch-size schedule is replayed over at most "
                        f"{MAX_EPOCHS:,} epochs, and step {step:,} ends the last of them"
                    )
                continue
            count = min([left] + self._steps_to_event(gbs, drawn, step, tokens, epoch))
            yield Segment(step + 1, count, epoch, drawn, per_batch, tokens)
            step, drawn, tokens = step + count, drawn + count, tokens + count * gbs

    def _due(self, change: BatchSizeChange, step: int, tokens: int, epoch: int) -> bool:
        """OLMo-core's `Duration.due`: steps and tokens from their value on, epochs once that many are done."""
        if change.unit == "steps":
            return step >= change.start
        if change.unit == "tokens":
            return tokens >= change.start
        return epoch > change.start

    def _steps_to_event(self, gbs: int, drawn: int, step: int, tokens: int, epoch: int) -> list[int]:
        """Steps (at least 1) after which `_apply` may give another answer: a change coming due, or a due
        increase waiting for the batches drawn in the epoch to be a multiple of its factor."""
        out = []
        for change in self.schedule:
            if not self._due(change, step, tokens, epoch):
                if change.unit == "steps":
                    out.append(change.start - step)
                elif change.unit == "tokens":
                    out.append(-(-(change.start - tokens) // gbs))
        due = [c for c in self.schedule if self._due(c, step, tokens, epoch)]
        if due and due[-1].tokens > gbs:
            out.append(-drawn % (due[-1].tokens // gbs) or 1)
        return out

    def _apply(self, gbs: int, drawn: int, step: int, tokens: int, epoch: int) -> tuple[int, int]:
        """`BatchSizeSchedulerCallback._maybe_update_batch_size_and_lr` and the loader's batch-size setter."""
        for change in reversed(self.schedule):
            if self._due(change, step, tokens, epoch):
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
        self._walk_to(last_step)  # segments are in (epoch, first position) order: search them
        i = bisect.bisect_right(self._keys, (epoch, position)) - 1
        if i < 0:
            return []
        seg = self._segments[i]
        k = (position - seg.first_batch * seg.instances) // seg.instances
        step = seg.first_step + k
        return [step] if seg.epoch == epoch and k < seg.count and step <= last_step else []
