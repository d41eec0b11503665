"""The batch OLMo-core's data loader yields at training step N, on any rank, rebuilt from its run's config.json.

`open_olmo_core(config)` reads the run (`olmo_data.olmo_core.config`), opens its dataset as OLMo-core numbers it
(`dataset`), walks steps to epochs and batches (`steps`, batch-size schedule included) and reads each epoch's order
from OLMo-core's own file in the work_dir, or rebuilds it by the same rule (`order`), saying which.
`OlmoCoreData.batch(step, rank, world_size)` then gives the instance numbers and tokens; `steps_of` goes the other
way, for trace: the steps (and ranks) that trained an instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from olmo_data.dataset import batch_fingerprint, rank_slice
from olmo_data.errors import DataError
from olmo_data.olmo_core.composable import Composable, open_composable
from olmo_data.olmo_core.config import MAX_EPOCHS, OlmoCoreRun, read_olmo_core_config
from olmo_data.olmo_core.dataset import CoreInstance, OlmoCoreDataset, open_core_dataset
from olmo_data.olmo_core.order import EpochOrder, olmo_core_order, olmo_core_order_note
from olmo_data.olmo_core.steps import StepSlot, StepWalk
from olmo_data.olmo_core.vsl_loader import VSLEpochOrder, VSLSlot, VSLWalk


@dataclass(frozen=True)
class OlmoCoreBatch:
    """Step `step`'s global batch as OLMo-core's loader cut it, and the part rank `rank` of `world_size` got.

    `instances` are OLMo-core's instance numbers in batch-position order (its batch dict's `index`); rank `r`
    got positions `r, r + W, ...` (`rank_instances`). `tokens` and `label_mask` are the rank's rows when a rank
    was asked for, else the whole batch's. `fingerprint` is always the global batch's (`olmo_data.dataset.fingerprint`).
    """

    step: int
    epoch: int  # 1-based, as OLMo-core numbers epochs
    batch_in_epoch: int  # 0-based
    global_batch_tokens: int
    instances: np.ndarray
    rank: int | None
    world_size: int
    tokens: np.ndarray | None
    label_mask: np.ndarray | None
    instance_mask: np.ndarray | None  # OLMo-core's: False where its instance filter drops the instance (None: off)
    fingerprint: str | None
    order_note: str  # where the epoch's order came from ("read from ..." or "rebuilt (...)")
    doc_lens: list[np.ndarray] | None = None  # packed with generate_doc_lengths: each row's OLMo-core doc_lens
    sequence_length: int = 0  # tokens a row (a VSL run's differ from step to step; 0: the run's sequence_length)
    rank_blocks: bool = False  # VSL: rank r got the r-th of W consecutive blocks of the batch, not every W-th

    @property
    def rank_instances(self) -> np.ndarray:
        if self.rank is None:
            return self.instances
        return rank_rows(self.instances, self.rank, self.world_size, self.rank_blocks)


@dataclass(frozen=True)
class TrainedAt:
    """An instance was in step `step`'s batch (epoch `epoch`), at position `position`, on rank `rank` of the
    world size asked about."""

    step: int
    epoch: int
    position: int
    rank: int


class OlmoCoreData:
    """One OLMo-core run's data side: dataset, step walk and epoch orders (each epoch's order built once)."""

    def __init__(self, run: OlmoCoreRun, dataset: OlmoCoreDataset | None = None) -> None:
        self.run = run
        # OLMo-core's composable API: its own sources, orders and step walk (olmo_data.olmo_core.composable)
        self.composable: Composable | None = open_composable(run) if run.composable is not None else None
        self.dataset = dataset or (self.composable.dataset if self.composable else open_core_dataset(run))
        self.walk: StepWalk
        if self.dataset.vsl is not None:  # batches of one bucket each, in its curriculum's order (vsl_loader)
            self.walk = VSLWalk(run, self.dataset.vsl)
        else:
            self.walk = StepWalk(
                len(self.dataset), run.sequence_length, run.global_batch_size, run.batch_sizes, source=run.source
            )
        self._orders: dict[int, EpochOrder] = {}
        if self.composable is not None:
            self.walk = self.composable.walk
        self.raw: dict[str, Any] = {}  # the config.json's keys, when read from one (its trainer section: max_duration)

    def epoch_order(self, epoch: int) -> EpochOrder | VSLEpochOrder:
        if isinstance(self.walk, VSLWalk):  # its batches' instances, batch after batch (vsl_loader)
            return self.walk.epoch_order(epoch)
        if epoch not in self._orders:
            if len(self._orders) >= 2:  # two epochs at a time: a large run's orders are gigabytes each
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = (
                self.composable.order(epoch)
                if self.composable is not None
                else olmo_core_order(self.run.work_dir, len(self.dataset), self.run.seed, epoch, self.run.chunk_size)
            )
        return self._orders[epoch]

    def order_note(self, epoch: int) -> str:
        """Where epoch `epoch`'s order comes from, as `epoch_order(epoch).note` says, without rebuilding a plain
        FSL order (gigabytes at scale) just to say so."""
        if isinstance(self.walk, VSLWalk) or self.composable is not None or epoch in self._orders:
            return self.epoch_order(epoch).note
        return olmo_core_order_note(self.run.work_dir, len(self.dataset), self.run.seed, epoch, self.run.chunk_size)

    def slot(self, step: int) -> StepSlot:
        return self.walk.slot(step)

    def epochs_of(self, first: int, last: int) -> range:
        """The epochs steps `first..last` read, refused past MAX_EPOCHS of them: each is walked with its order
        whole (read or rebuilt), so a hostile max_duration or --steps must not make that work without bound."""
        first_epoch, last_epoch = self.walk.slot(first).epoch, self.walk.slot(last).epoch
        if last_epoch - first_epoch + 1 > MAX_EPOCHS:
            raise DataError(
                f"{self.run.source}: steps {first:,}..{last:,} span epochs {first_epoch:,}..{last_epoch:,} of "
                f"OLMo-core's run; at most {MAX_EPOCHS:,} epochs are walked (each one's order whole): give --steps "
                "A..B within fewer epochs, or check trainer.max_duration"
            )
        return range(first_epoch, last_epoch + 1)

    def instances(self, step: int) -> tuple[StepSlot, np.ndarray, str]:
        """Step `step`'s global batch: its slot, OLMo-core instance numbers (batch-position order), order note."""
        slot = self.walk.slot(step)
        order = self.epoch_order(slot.epoch)
        return slot, order.entries(slot.start, slot.start + slot.instances), order.note

    def batch(self, step: int, rank: int | None = None, world_size: int = 1, *, read: bool = True) -> OlmoCoreBatch:
        """The batch of training step `step` (1-based); with `read`, its tokens and the global fingerprint."""
        slot, instances, note = self.instances(step)
        blocks = isinstance(self.walk, VSLWalk)
        if isinstance(self.walk, VSLWalk):  # every bucket's batches split whole, as OLMo-core's loader reads them
            check_world(self.walk.fewest_instances, rank, world_size, self.run)
            self.walk.check_threads(slot.epoch, world_size)
        check_world(slot.instances, rank, world_size, self.run)
        tokens = mask = keep = None
        fingerprint = None
        lens: list[np.ndarray] | None = None
        if read:
            tokens, mask = self.dataset.get_batch(instances)
            fingerprint = batch_fingerprint(tokens)
            keep = self.instance_mask(instances, tokens)
            if rank is not None:
                tokens = rank_rows(tokens, rank, world_size, blocks)
                mask = rank_rows(mask, rank, world_size, blocks) if mask is not None else None
                keep = rank_rows(keep, rank, world_size, blocks) if keep is not None else None
            if self.run.generate_doc_lengths and self.dataset.packed is not None:
                rows = rank_rows(instances, rank, world_size, blocks) if rank is not None else instances
                lens = self.dataset.packed.doc_lens(rows, tokens)
            if self.run.generate_doc_lengths and self.composable is not None:
                lens = self.composable.doc_lens(tokens)
        length = slot.sequence_length if isinstance(slot, VSLSlot) else self.run.sequence_length
        return OlmoCoreBatch(
            step=step,
            epoch=slot.epoch,
            batch_in_epoch=slot.batch,
            global_batch_tokens=slot.instances * length,
            instances=instances,
            rank=rank,
            world_size=world_size,
            tokens=tokens,
            label_mask=mask,
            instance_mask=keep,
            fingerprint=fingerprint,
            order_note=note,
            doc_lens=lens,
            sequence_length=length,
            rank_blocks=blocks,
        )

    def instance_mask(self, instances: np.ndarray, tokens: np.ndarray) -> np.ndarray | None:
        """OLMo-core's `instance_mask` of these instances (True: trained on), None when the run has no filter.
        It judges an instance by its own tokens: a padded instance without its padding."""
        rule = self.run.instance_filter
        if rule is None:
            return None
        if self.dataset.interleaved is not None:  # every document of the instance judged on its own tokens
            return self.dataset.interleaved.instance_mask(instances, rule)
        if self.dataset.documents is None:
            return ~rule.filtered(tokens)
        lengths = [loc.length for loc in self.dataset.locate(instances)]
        return np.array([not rule.filtered(row[:n])[0] for row, n in zip(tokens, lengths, strict=True)], dtype=bool)

    def steps_of(self, instance: int, last_step: int, world_size: int = 1) -> list[TrainedAt]:
        """Every step up to `last_step` whose batch held OLMo-core instance `instance` (once per epoch at most)."""
        if not 0 <= instance < len(self.dataset):
            raise DataError(f"instance {instance} is out of range: OLMo-core's dataset has {len(self.dataset)}")
        out: list[TrainedAt] = []
        for epoch in self.epochs_of(1, last_step):
            hit = np.flatnonzero(self.epoch_order(epoch).whole() == instance)
            if not hit.size:
                continue  # a chunked order leaves the dataset's last partial chunk out
            position = int(hit[0])
            for step in self.walk.steps_of(epoch, position, last_step):
                slot = self.walk.slot(step)
                within = position - slot.start
                out.append(TrainedAt(step, epoch, within, self.walk.rank_of(within, slot.instances, world_size)))
        return out

    def record(self, batch: OlmoCoreBatch) -> dict[str, Any]:
        """A batch as plain JSON values (for `inspect-batch --json`): where it sits in OLMo-core's run, where its
        order came from, and for each of its instances (the rank's, when a rank was asked for) the file, first
        token, length and mixture source."""
        rows = batch.rank_instances
        lens = batch.doc_lens
        return {
            "trainer": "olmo-core",
            "config": self.run.source,
            "step": batch.step,
            "epoch": batch.epoch,
            "batch_in_epoch": batch.batch_in_epoch,
            "global_batch_tokens": batch.global_batch_tokens,
            "sequence_length": batch.sequence_length or self.run.sequence_length,
            "seed": self.run.seed,
            "rank": batch.rank,
            "world_size": batch.world_size,
            "fingerprint": batch.fingerprint,
            "order": batch.order_note,
            "instances": [
                {"index": loc.index, "path": loc.path, "start": loc.start, "length": loc.length, "source": loc.source}
                | ({"trained": bool(batch.instance_mask[i])} if batch.instance_mask is not None else {})
                | ({"pieces": [list(p) for p in loc.pieces]} if loc.pieces else {})
                | ({"pieces_at": list(loc.at)} if loc.at else {})
                | ({"doc_lens": lens[i].tolist()} if lens is not None else {})
                for i, loc in enumerate(self.dataset.locate(rows))
            ],
        }

    def locate(self, instances: Any) -> list[CoreInstance]:
        """Which file, and which tokens of it, each OLMo-core instance is."""
        return self.dataset.locate(instances)


def rank_rows(rows: np.ndarray, rank: int, world_size: int, blocks: bool) -> np.ndarray:
    """Rank `rank`'s rows of a global batch: every W-th from its own (FSL), or its block of W (VSL)."""
    return rank_slice(rows, rank, world_size, blocks)


def check_world(instances_per_batch: int, rank: int | None, world_size: int, run: OlmoCoreRun) -> None:
    if world_size < 1 or instances_per_batch % world_size:
        raise DataError(
            f"{run.source}: a batch of {instances_per_batch} instances cannot be split over {world_size} ranks "
            "(OLMo-core requires the rank batch to be whole instances)"
        )
    if rank is not None and not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is not one of the {world_size} ranks")


def open_olmo_core(config: str | dict[str, Any], *, work_dir: str | None = None) -> OlmoCoreData:
    """An OLMo-core run's data side from its config.json (a path or its parsed dict); `work_dir` replaces the
    run's own folder of order files (for runs inspected away from their machine)."""
    return OlmoCoreData(read_olmo_core_config(config, work_dir=work_dir))


def olmo_core_batch(
    config: str | dict[str, Any], step: int, rank: int | None = None, world_size: int = 1
) -> OlmoCoreBatch:
    """The batch OLMo-core's loader yields at training step `step` (on `rank` of `world_size`, or all of it)."""
    return open_olmo_core(config).batch(step, rank, world_size)
