"""OLMo-core's `NumpyVSLDataLoader`: which bucket's batch training step N drew, its instances, and its order files.

Each epoch (from 1) the loader shuffles every bucket L with `PCG64(seed + epoch + L)` (`permutation` of the
bucket's instance numbers) and orders the epoch's batches by the curriculum (`vsl_curriculum`, from
`PCG64(seed + epoch)`). Batch j of bucket L is instances `j*n .. j*n + n - 1` of the bucket's shuffled order
(`n = global_batch_size // L`); data-parallel rank r of W takes the r-th of W consecutive blocks of them (not every
W-th instance, as the FSL loader does). Every step trains `global_batch_size` tokens; an epoch is the sum of the
curriculum's batches per bucket, the same every epoch. A batch-size schedule is refused (config.py): this loader
keeps its batch counts from its first batch size.

The loader writes, under `work_dir/dataset-{fingerprint}/{curriculum short name}/`, each bucket's shuffled order
(`instance_indices_bucket{L}_epoch{e}_seed{s}.npy`) and the epoch's batch order (`global_batch_indices_bz{tokens}
_epoch{e}_seed{s}.npy`), uint32; they are read when there (checked), else rebuilt, and `build-order` writes them.

Here an epoch's "order" (`VSLEpochOrder`) is its batches' instances one batch after another, so that a step's
slot (`VSLSlot.start`) is a position in it, as for the fixed-length loader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from olmo_data.dataset import DatasetStats
from olmo_data.errors import DataError
from olmo_data.olmo_core.cache_files import keep_or_write
from olmo_data.olmo_core.config import OlmoCoreRun
from olmo_data.olmo_core.order import positions_in
from olmo_data.olmo_core.steps import StepSlot, StepWalk
from olmo_data.olmo_core.vsl import INDEX_DTYPE, VSLInstances, dataset_files
from olmo_data.olmo_core.vsl_curriculum import VSLCurriculum, batch_order, batches_per_bucket

KEEP_EPOCHS = 2  # epoch plans kept at once (their bucket orders are as large as the dataset)


@dataclass(frozen=True)
class VSLSlot(StepSlot):
    """A VSL step's slot: `instances` of `sequence_length` tokens from position `first` of the epoch's order."""

    first: int = 0
    sequence_length: int = 0

    @property
    def start(self) -> int:
        return self.first


@dataclass
class VSLEpoch:
    """One epoch's batches in draw order: their bucket's length, their number within the bucket, where their
    instances start in the epoch's order, and the files read."""

    epoch: int
    lengths: np.ndarray  # per drawn batch, its bucket's length
    within: np.ndarray  # per drawn batch, its number within its bucket
    starts: np.ndarray  # (batches + 1,) positions of each batch's first instance in the epoch's order
    batch_file: str | None  # OLMo-core's batch order file, when read
    bucket_orders: dict[int, tuple[np.ndarray, bool]] = field(default_factory=dict)  # length: (order, from a file)


def loader_folder(run: OlmoCoreRun, vsl: VSLInstances, work_dir: str | None = None) -> str:
    curriculum = run.curriculum or VSLCurriculum()
    return os.path.join(work_dir or run.work_dir, f"dataset-{vsl.fingerprint}", curriculum.short_str)


def batch_order_name(run: OlmoCoreRun, epoch: int) -> str:
    return f"global_batch_indices_bz{run.global_batch_size}_epoch{epoch}_seed{run.seed}.npy"


def bucket_order_name(run: OlmoCoreRun, length: int, epoch: int) -> str:
    return f"instance_indices_bucket{length}_epoch{epoch}_seed{run.seed}.npy"


class VSLWalk(StepWalk):
    """Step N -> the batch OLMo-core's VSL loader drew (`VSLSlot`), for `OlmoCoreData` (a `StepWalk` without a
    schedule: batches per epoch are the curriculum's, the same every epoch)."""

    def __init__(self, run: OlmoCoreRun, vsl: VSLInstances) -> None:  # StepWalk's own state: not used
        self.run = run
        self.vsl = vsl
        self.source = run.source
        self.dataset_size = len(vsl)
        self.sequence_length = run.sequence_length
        self.global_batch_size = run.global_batch_size
        self.schedule = ()
        self.curriculum = run.curriculum or VSLCurriculum()
        self.per_bucket = batches_per_bucket(self.curriculum, vsl.instances_per_bucket, run.global_batch_size)
        self.total = sum(b for _, b in self.per_bucket)
        self.bucket_starts = np.cumsum([0] + [b for _, b in self.per_bucket]).astype(np.int64)
        self.folder = loader_folder(run, vsl)
        self._plans: dict[int, VSLEpoch] = {}
        self.plan(1)  # what OLMo-core fails on (no batch, its curriculum's rounding) refused at once

    @property
    def fewest_instances(self) -> int:
        """Instances in a batch of the longest bucket that has batches (each rank must get whole ones)."""
        return self.global_batch_size // max(length for length, b in self.per_bucket if b)

    def batches_per_epoch(self, tokens: int | None = None) -> int:
        return self.total

    def rank_of(self, within: int, instances: int, world_size: int) -> int:
        return within // (instances // world_size)

    def slot(self, step: int) -> VSLSlot:
        if step < 1:
            raise DataError(f"training steps count from 1, got step {step}")
        epoch, b = divmod(step - 1, self.total)
        plan = self.plan(epoch + 1)
        length = int(plan.lengths[b])
        return VSLSlot(
            step,
            epoch + 1,
            b,
            self.global_batch_size // length,
            (step - 1) * self.global_batch_size,
            first=int(plan.starts[b]),
            sequence_length=length,
        )

    def steps_of(self, epoch: int, position: int, last_step: int) -> list[int]:
        plan = self.plan(epoch)
        if not 0 <= position < int(plan.starts[-1]):
            return []
        step = (epoch - 1) * self.total + int(np.searchsorted(plan.starts, position, side="right"))
        return [step] if step <= last_step else []

    def check_threads(self, epoch: int, world_size: int) -> None:
        """Refuse the loader's reading that OLMo-core 3.0.0 gets wrong: in the training process, with T > 1
        threads, a thread first asked for an instance after the epoch's first batch was counted skips that batch
        (its instance list is a generator reading the count late), so rows repeat and the loader fails. That
        happens when the first batch gives a rank fewer than T - 1 instances."""
        threads = self.run.loader_threads
        first = (self.global_batch_size // int(self.plan(epoch).lengths[0])) // world_size
        if threads > 1 and first < threads - 1:
            raise DataError(
                f"{self.source}: OLMo-core's VSL loader reads instances in {threads} threads (data_loader.num_threads"
                f", num_workers 0) and epoch {epoch}'s first batch gives each of {world_size} ranks {first} "
                f"instances, fewer than {threads - 1}: OLMo-core 3.0.0 then repeats rows and fails; not covered"
            )

    def plan(self, epoch: int) -> VSLEpoch:
        if epoch not in self._plans:
            if len(self._plans) >= KEEP_EPOCHS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[epoch] = self._plan(epoch)
        return self._plans[epoch]

    def _plan(self, epoch: int) -> VSLEpoch:
        path = os.path.join(self.folder, batch_order_name(self.run, epoch))
        if os.path.isfile(path):
            order = self._read_batch_order(path, epoch)
        else:
            order, path = self.rebuilt_batch_order(epoch), ""
        bucket = np.searchsorted(self.bucket_starts, order, side="right") - 1
        lengths = np.array([length for length, _ in self.per_bucket], dtype=np.int64)[bucket]
        within = order.astype(np.int64) - self.bucket_starts[bucket]
        starts = np.concatenate([[0], np.cumsum(self.global_batch_size // lengths)]).astype(np.int64)
        return VSLEpoch(epoch, lengths, within, starts, path or None)

    def rebuilt_batch_order(self, epoch: int) -> np.ndarray:
        return batch_order(self.curriculum, self.per_bucket, self.run.seed + epoch, self.source)

    def rebuilt_bucket_order(self, epoch: int, length: int) -> np.ndarray:
        members = dict(self.vsl.buckets)[length]
        return np.random.Generator(np.random.PCG64(self.run.seed + epoch + length)).permutation(members)

    def _read_batch_order(self, path: str, epoch: int) -> np.ndarray:
        """OLMo-core's batch order of an epoch, checked whole (it is small): each batch number once."""
        if os.path.getsize(path) != 4 * self.total:
            raise DataError(
                f"{path}: {os.path.getsize(path):,} bytes, but OLMo-core's VSL batch order of epoch {epoch} is "
                f"{self.total:,} uint32 batch numbers; the file is truncated or another run's: remove it"
            )
        order = np.fromfile(path, dtype=INDEX_DTYPE)
        if not np.array_equal(np.sort(order), np.arange(self.total)):
            raise DataError(
                f"{path}: not an order of batches 0..{self.total - 1:,} (one missing or twice); the file is damaged "
                "or another run's: remove it to rebuild it"
            )
        return order

    def bucket_order(self, plan: VSLEpoch, length: int) -> tuple[np.ndarray, bool]:
        """A bucket's shuffled order in an epoch: OLMo-core's file (mapped, its size checked) or rebuilt."""
        if length not in plan.bucket_orders:
            path = os.path.join(self.folder, bucket_order_name(self.run, length, plan.epoch))
            count = len(dict(self.vsl.buckets)[length])
            if os.path.isfile(path):
                if os.path.getsize(path) != 4 * count:
                    raise DataError(
                        f"{path}: {os.path.getsize(path):,} bytes, but bucket {length:,} holds {count:,} instances "
                        "(uint32 each); the file is truncated or another run's: remove it"
                    )
                plan.bucket_orders[length] = (np.memmap(path, dtype=INDEX_DTYPE, mode="r"), True)
            else:
                plan.bucket_orders[length] = (self.rebuilt_bucket_order(plan.epoch, length), False)
        return plan.bucket_orders[length]

    def epoch_order(self, epoch: int) -> VSLEpochOrder:
        return VSLEpochOrder(self, self.plan(epoch))


class VSLEpochOrder:
    """An epoch's instances, batch after batch in draw order (the `EpochOrder` of a VSL run)."""

    def __init__(self, walk: VSLWalk, plan: VSLEpoch) -> None:
        self.walk = walk
        self.plan = plan
        self.epoch = plan.epoch
        self.path = plan.batch_file
        found = sum(
            os.path.isfile(os.path.join(walk.folder, bucket_order_name(walk.run, length, plan.epoch)))
            for length, _ in walk.vsl.buckets
        )
        buckets = len(walk.vsl.buckets)
        where = f"{found} of {buckets} bucket orders read" if found else "bucket orders rebuilt"
        self.note = (
            f"read from {self.path} ({where})"
            if self.path
            else f"rebuilt ({os.path.join(walk.folder, batch_order_name(walk.run, plan.epoch))} not found; {where})"
        )
        self._whole: np.ndarray | None = None

    def _batch(self, b: int) -> np.ndarray:
        """The instances of the epoch's b-th batch (those from a file checked to be of its bucket)."""
        length, within = int(self.plan.lengths[b]), int(self.plan.within[b])
        per = self.walk.global_batch_size // length
        order, from_file = self.walk.bucket_order(self.plan, length)
        out = np.asarray(order[within * per : (within + 1) * per], dtype=np.int64)
        if from_file:
            lengths = self.walk.vsl.stored_lengths
            bad = (out >= len(lengths)) | (lengths[np.minimum(out, len(lengths) - 1)] != length)
            if bad.any():
                path = os.path.join(self.walk.folder, bucket_order_name(self.walk.run, length, self.epoch))
                raise DataError(
                    f"{path}: entry {within * per + int(np.argmax(bad)):,} is instance {int(out[bad][0]):,}, not one "
                    f"of bucket {length:,}; the file is damaged or another run's: remove it to rebuild it"
                )
        return out

    def entries(self, start: int, stop: int) -> np.ndarray:
        """Positions `start .. stop` of the epoch's order (instance numbers, int64)."""
        starts = self.plan.starts
        parts = []
        b = int(np.searchsorted(starts, start, side="right")) - 1
        while 0 <= b < len(starts) - 1 and starts[b] < stop:
            lo, hi = max(start - int(starts[b]), 0), min(stop, int(starts[b + 1])) - int(starts[b])
            parts.append(self._batch(b)[lo:hi])
            b += 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def whole(self) -> np.ndarray:
        """The epoch's order whole, each bucket order read from a file checked whole (each instance once)."""
        if self._whole is None:
            for length, members in self.walk.vsl.buckets:
                order, from_file = self.walk.bucket_order(self.plan, length)
                if from_file and not np.array_equal(np.sort(np.asarray(order)), members):
                    path = os.path.join(self.walk.folder, bucket_order_name(self.walk.run, length, self.epoch))
                    raise DataError(
                        f"{path}: not an order of bucket {length:,}'s {len(members):,} instances (one missing or "
                        "twice); the file is damaged or another run's: remove it to rebuild it"
                    )
            self._whole = self.entries(0, int(self.plan.starts[-1]))
        return self._whole

    def positions_of(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, entries) of the epoch's order holding one of the instances `wanted` (as EpochOrder's)."""
        return positions_in(self.whole(), wanted)


def vsl_stats(stats: DatasetStats, walk: VSLWalk) -> list[dict[str, int]]:
    """`stats` of a VSL run counted by bucket (instances of several lengths; a batch of the longest bucket is
    `global_batch_size // max_sequence_length` instances), and per bucket its instances and batches an epoch."""
    gbs, vsl = walk.global_batch_size, walk.vsl
    stats.instance_tokens = sum(length * n for length, n in vsl.instances_per_bucket)
    stats.global_batch_size = gbs // walk.sequence_length
    stats.dropped_per_epoch = len(vsl) - sum(b * (gbs // length) for length, b in walk.per_bucket)
    return [
        {"length": length, "instances": n, "batches_per_epoch": b, "instances_per_batch": gbs // length}
        for (length, n), (_, b) in zip(vsl.instances_per_bucket, walk.per_bucket, strict=True)
    ]


def vsl_files(walk: VSLWalk, epochs: range, destination: str | None) -> list[tuple[str, bytes, str]]:
    """(path, bytes, what) of every file OLMo-core's VSL dataset and loader write for these epochs, under their
    names in `destination` (default: the run's work_dirs), rebuilt whatever files are there."""
    run = walk.run
    out = dataset_files(walk.vsl, destination or run.dataset_work_dir)
    folder = loader_folder(run, walk.vsl, destination)
    for epoch in epochs:
        for length, _ in walk.vsl.buckets:
            data = walk.rebuilt_bucket_order(epoch, length).astype(INDEX_DTYPE).tobytes()
            name = bucket_order_name(run, length, epoch)
            out.append((os.path.join(folder, name), data, f"epoch {epoch}'s order of bucket {length}"))
        data = walk.rebuilt_batch_order(epoch).astype(INDEX_DTYPE).tobytes()
        out.append((os.path.join(folder, batch_order_name(run, epoch)), data, f"epoch {epoch}'s batch order"))
    return out


def write_vsl_files(walk: VSLWalk, epochs: range, destination: str | None) -> list[str]:
    """Write `vsl_files` (for `build-order`); one already there is kept only when identical, byte for byte."""
    lines = []
    for path, data, what in vsl_files(walk, epochs, destination):
        if keep_or_write(path, data, f"not the {what} OLMo-core writes for this run; remove it, or check the run"):
            lines.append(f"vsl: wrote {path} ({what}): OLMo-core's name and bytes")
        else:
            lines.append(f"vsl: {path} is there, identical to OLMo-core's (kept)")
    return lines
