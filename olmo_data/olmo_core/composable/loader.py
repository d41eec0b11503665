"""OLMo-core's `ComposableDataLoader`: which sources an epoch reads, its order by shuffle strategy, and the steps.

* Sources: with `sources_per_epoch` k, epoch e (1-based) reads the ((e - 1) mod G)-th run of k consecutive
  sources of the dataset list (G = sources / k); else all of them. The loader's instance index counts the
  epoch's sources end to end. Our instance numbers count *all* the sources end to end (so an instance has one
  number in every epoch): the loader's index plus the instances of the sources before the epoch's.
* Orders (`build_global_indices`: chunks of M // L instances shuffled by `PCG64(seed)`):
  `inter_source` (the default) shuffles the epoch's instances as one with seed + epoch; `intra_source` shuffles
  each source with seed + epoch + i and puts the sources one after the other; `interleaved_source` takes
  min(len) instances of each source (shuffled so) and interleaves them, source by source; with `shuffle: false`
  the order is the instances in turn.
* Steps: an epoch is cut into batches of `global_batch_size // L` instances (the tail dropped) as OLMo-core's
  other loaders are, rank r of W taking positions r, r + W, ... (`olmo_data.olmo_core.steps`). When epochs have
  different sizes (sources_per_epoch over sources of different sizes) the steps cycle through them.

OLMo-core writes each epoch's order in its work_dir as `global_indices_epoch{e}_max_seq_len{M}_seed{s}_seq_len{L}
_shuffle{strategy}_size{N}_v1.npy` (the seed, epoch and strategy left out without shuffling). Its name does not
tell the data apart, so a file found there is compared with the order the config implies and refused when it
differs.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from olmo_data.errors import DataError
from olmo_data.io import atomic_path
from olmo_data.olmo_core.composable.instances import InstanceSource
from olmo_data.olmo_core.composable.spec import ComposableSpec
from olmo_data.olmo_core.config import OlmoCoreRun
from olmo_data.olmo_core.order import EpochOrder
from olmo_data.olmo_core.steps import StepSlot, StepWalk


def global_indices(total: int, sequence_length: int, max_sequence_length: int, seed: int | None) -> np.ndarray:
    """OLMo-core's `build_global_indices`: whole chunks of M // L instances, shuffled with PCG64(seed) (in order
    when `seed` is None), each expanded to its instances."""
    chunk = max_sequence_length // sequence_length
    if total % chunk:
        raise DataError(f"{total:,} instances are not whole chunks of {chunk}; OLMo-core refuses to order them")
    if total >= np.iinfo(np.uint32).max:
        raise DataError(f"{total:,} instances do not fit OLMo-core's uint32 orders")
    chunks = np.arange(total // chunk, dtype=np.uint32)
    if seed is not None:
        np.random.Generator(np.random.PCG64(seed)).shuffle(chunks)
    if chunk == 1:
        return chunks
    out = np.repeat(chunks.astype(np.int64) * chunk, chunk).reshape(-1, chunk) + np.arange(chunk)[None, :]
    return out.reshape(-1).astype(np.uint32)


@dataclass
class ComposableOrder(EpochOrder):
    """An epoch's order in our instance numbers (OLMo-core's file, when found, was compared with it whole)."""

    def whole(self) -> np.ndarray:
        return np.asarray(self.order)


class Loader:
    """The loader's sources, per-epoch sizes and orders (see the module)."""

    def __init__(self, spec: ComposableSpec, sources: list[InstanceSource], run: OlmoCoreRun) -> None:
        self.spec, self.sources, self.run = spec, sources, run
        self.per_epoch = spec.sources_per_epoch if spec.sources_per_epoch > 0 else len(sources)
        self.groups = len(sources) // self.per_epoch
        self.offsets = list(accumulate((len(s) for s in sources), initial=0))
        chunk = spec.max_sequence_length // spec.sequence_length
        for i, s in enumerate(sources):
            if chunk > 1 and len(s) % chunk:
                raise DataError(
                    f"{spec.source}: dataset[{i}] has {len(s):,} instances, not a multiple of max_sequence_length "
                    f"// sequence_length ({chunk}); OLMo-core's loader refuses it"
                )

    def __len__(self) -> int:
        return self.offsets[-1]

    @property
    def has_mask(self) -> bool:
        return self.sources[0].has_mask

    def epoch_sources(self, epoch: int) -> range:
        """The dataset-list positions of the sources epoch `epoch` reads."""
        first = (epoch - 1) % self.groups * self.per_epoch
        return range(first, first + self.per_epoch)

    def epoch_size(self, epoch: int) -> int:
        """OLMo-core's `instances_in_epoch`."""
        sizes = [len(self.sources[i]) for i in self.epoch_sources(epoch)]
        if self.spec.strategy == "interleaved_source":
            return min(sizes) * len(sizes)
        return sum(sizes)

    def locate(self, index: int) -> tuple[int, int]:
        """(dataset-list position, instance within that source) of one of our instance numbers."""
        if not 0 <= index < len(self):
            raise DataError(f"instance {index} is out of range: the run's sources have {len(self)}")
        k = bisect_right(self.offsets, index) - 1
        while self.offsets[k + 1] == self.offsets[k]:
            k += 1
        return k, index - self.offsets[k]

    def loader_order(self, epoch: int) -> np.ndarray:
        """OLMo-core's global indices of epoch `epoch` (its own numbering: the epoch's sources end to end)."""
        spec, L, M = self.spec, self.spec.sequence_length, self.spec.max_sequence_length
        seed = self.run.seed + epoch
        chosen = [self.sources[i] for i in self.epoch_sources(epoch)]
        if spec.strategy in (None, "inter_source"):
            return global_indices(self.epoch_size(epoch), L, M, seed if spec.shuffle else None)
        if spec.strategy == "intra_source":
            parts, offset = [], 0
            for i, s in enumerate(chosen):
                parts.append(global_indices(len(s), L, M, seed + i).astype(np.int64) + offset)
                offset += len(s)
            return np.concatenate(parts).astype(np.uint32)
        size = min(len(s) for s in chosen)
        out = np.empty(len(chosen) * size, dtype=np.uint32)
        offset = 0
        for i, s in enumerate(chosen):
            out[i :: len(chosen)] = global_indices(size, L, M, seed + i).astype(np.int64) + offset
            offset += len(s)
        return out

    def file_name(self, epoch: int) -> str:
        """The name OLMo-core gives epoch `epoch`'s order (`ComposableDataLoader.global_indices_file`)."""
        spec = self.spec
        fields = {
            "seed": self.run.seed if spec.shuffle else None,
            "epoch": epoch if spec.shuffle else None,
            "shuffle": spec.strategy,
            "size": self.epoch_size(epoch),
            "seq_len": spec.sequence_length,
            "max_seq_len": spec.max_sequence_length,
            "v": 1,
        }
        return "_".join(["global_indices"] + [f"{k}{fields[k]}" for k in sorted(fields) if fields[k] is not None])

    def order(self, epoch: int) -> ComposableOrder:
        """Epoch `epoch`'s order in our instance numbers, rebuilt; OLMo-core's file, when in the work_dir,
        compared with it whole (see the module)."""
        if epoch < 1:
            raise DataError(f"OLMo-core numbers epochs from 1, got epoch {epoch}")
        local = self.loader_order(epoch)
        path = os.path.join(self.run.work_dir, self.file_name(epoch) + ".npy")
        note = f"rebuilt ({path} not found)"
        if os.path.isfile(path):
            check_stored(path, local, epoch)
            note = f"read from {path} (checked whole against the rebuilt order)"
        offset = self.offsets[self.epoch_sources(epoch)[0]]
        order = local.astype(np.int64) + offset
        return ComposableOrder(epoch, order, path if "read" in note else None, note, len(self))

    def write_orders(self, epochs: range, folder: str) -> list[str]:
        """Epochs' orders under OLMo-core's names and bytes in `folder` (its loader takes them as its own with that
        work_dir); one already there is kept only when it is the same order, else refused."""
        lines = []
        os.makedirs(folder, exist_ok=True)
        for epoch in epochs:
            path = os.path.join(folder, self.file_name(epoch) + ".npy")
            want = self.loader_order(epoch).astype("<u4")
            if os.path.lexists(path):
                check_stored(path, want, epoch)
                lines.append(f"epoch {epoch}: {path} is there, identical to OLMo-core's order (kept)")
                continue
            with atomic_path(path) as tmp:
                want.tofile(tmp)
            lines.append(f"epoch {epoch}: wrote {path} ({len(want):,} instances): OLMo-core's name and bytes")
        return lines

    def steps_in(self, epochs: int) -> int:
        """The steps of epochs 1..`epochs` without a batch-size schedule (each epoch its own size)."""
        per_batch = self.run.global_batch_size // self.spec.sequence_length
        cycle = [self.epoch_size(e) // per_batch for e in range(1, self.groups + 1)]
        whole, rest = divmod(epochs, self.groups)
        return whole * sum(cycle) + sum(cycle[:rest])

    def walk(self) -> StepWalk:
        """Step -> epoch and batch: OLMo-core's walk (batch-size schedule included) when every epoch has the same
        size, else a cycle through the epochs' sizes."""
        sizes = [self.epoch_size(e) for e in range(1, self.groups + 1)]
        L, gbs, source = self.spec.sequence_length, self.run.global_batch_size, self.spec.source
        if len(set(sizes)) == 1:
            return StepWalk(sizes[0], L, gbs, self.run.batch_sizes, source=source)
        if self.run.batch_sizes:
            raise DataError(
                f"{source}: a batch-size schedule over epochs of different sizes ({sizes} instances, "
                "data_loader.sources_per_epoch): not covered"
            )
        return CycleWalk(sizes, L, gbs, source)


def check_stored(path: str, rebuilt: np.ndarray, epoch: int) -> None:
    """OLMo-core's order file of an epoch equals the order the config implies, or one line saying where not."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: not a file where OLMo-core's order of epoch {epoch} belongs; remove it")
    size = os.path.getsize(path)
    if size != 4 * len(rebuilt):
        raise DataError(
            f"{path}: {size:,} bytes, but the order of epoch {epoch} the config implies is {len(rebuilt):,} uint32 "
            "numbers; the file is truncated or another run's (OLMo-core's order names do not tell datasets apart): "
            "remove it, or point --order at the run's work_dir"
        )
    stored = np.fromfile(path, dtype="<u4")
    differ = np.flatnonzero(stored != rebuilt)
    if differ.size:
        at = int(differ[0])
        raise DataError(
            f"{path}: entry {at:,} is instance {int(stored[at]):,}, but the order of epoch {epoch} the config implies "
            f"has {int(rebuilt[at]):,} there; the file is another run's (OLMo-core's order names do not tell datasets "
            "apart) or damaged: remove it, or point --order at the run's work_dir"
        )


class CycleWalk(StepWalk):
    """Steps through epochs whose sizes cycle (`sizes`: instances of epochs 1..G), without a batch-size schedule."""

    def __init__(self, sizes: list[int], sequence_length: int, global_batch_size: int, source: str) -> None:
        super().__init__(min(sizes), sequence_length, global_batch_size, (), source=source)
        per_batch = global_batch_size // sequence_length
        self.per_batch = per_batch
        self.batches = [n // per_batch for n in sizes]
        self.bounds = list(accumulate(self.batches, initial=0))

    def batches_per_epoch(self, tokens: int | None = None, epoch: int = 1) -> int:
        return self.batches[(epoch - 1) % len(self.batches)]

    def slot(self, step: int) -> StepSlot:
        if step < 1:
            raise DataError(f"training steps count from 1, got step {step}")
        cycles, within = divmod(step - 1, self.bounds[-1])
        g = bisect_right(self.bounds, within) - 1
        epoch = cycles * len(self.batches) + g + 1
        return StepSlot(step, epoch, within - self.bounds[g], self.per_batch, (step - 1) * self.global_batch_size)

    def steps_of(self, epoch: int, position: int, last_step: int) -> list[int]:
        g = (epoch - 1) % len(self.batches)
        batch = position // self.per_batch
        step = (epoch - 1) // len(self.batches) * self.bounds[-1] + self.bounds[g] + batch + 1
        return [step] if batch < self.batches[g] and step <= last_step else []
