"""The run reader for this project's trainer and OLMo's (`reader.RunData`): a config of ours or OLMo's YAML.

Instances are OLMo's cutting of the token files (`dataset.instances`, a mix included), orders are OLMo's
permutations PCG64(seed + epoch) stored as `global_indices.npy` per epoch from 0 (`dataset.order`), steps are
batches of `global_train_batch_size` instances. The instance filter is OLMo's rule (`dataset.instance_filter`),
which also says which repetition caught an instance.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig, read_run_config
from olmo_data.dataset import (
    DocIndex,
    DocumentSpan,
    InstanceSource,
    Sources,
    TokenFile,
    already_verified,
    batch_fingerprint,
    batches_per_epoch,
    build_config_orders,
    build_order,
    check_order_entries,
    format_stats,
    instance_filter_of,
    load_order,
    open_from_config,
    order_location,
    order_path_for_epoch,
    read_order_range,
    remember_verified,
    run_steps,
    search_order_file,
    stats_for,
    step_position,
    verified_marker,
)
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.run.lineage import Stage, read_lineage, run_stage
from olmo_data.run.reader import Filtered, Held, Placed, RunData, StepBatch, Trained
from olmo_data.tokenizer import Tokenizer, data_tokenizer


class OlmoRun(RunData):
    """A run of ours or OLMo's, from its config (`cfg`) and the instances it names (`source`). `order` replaces
    where the orders are read (a directory, an epoch-0 order file or a URL); `verify_data=False` accepts an order
    whose recorded data fingerprint differs from the data's (the same files moved elsewhere)."""

    def __init__(
        self,
        config: Any,
        cfg: TrainConfig | None = None,
        *,
        source: InstanceSource | None = None,
        order: str | None = None,
        verify_data: bool = True,
    ) -> None:
        self.config = config
        self.own = cfg if cfg is not None else read_run_config(config)
        self.cfg = self.own
        self.source = source if source is not None else open_from_config(self.cfg)
        self.order = order
        self.verify_data = verify_data
        self.sequence_length = self.source.sequence_length
        self.seed = self.cfg.seed
        self.num_instances = len(self.source)
        self.assumed_dtype = self.source.assumed_dtype
        self.gbs = self.cfg.global_train_batch_size
        self._filter = instance_filter_of(self.cfg)
        self._sources: Sources | None = None
        self._masked = any(f.label_mask_path for f in self.source.files)

    @property
    def location(self) -> str:
        return self.order or order_location(self.cfg)

    def data_fingerprint(self) -> str:
        return self.source.fingerprint()

    def run_steps(self) -> int | None:
        return run_steps(self.cfg, self.num_instances)

    def batch_size(self, step: int) -> int:
        return self.gbs

    def batch(self, step: int) -> StepBatch:
        pos = step_position(step, self.gbs, self.num_instances)
        path = order_path_for_epoch(self.location, pos.epoch)
        start, stop = pos.order_range(self.gbs)
        if not is_remote(path) and not os.path.exists(path):
            raise DataError(
                f"step {pos.step} is past the end of the orders built: it is batch {pos.batch_in_epoch} of epoch "
                f"{pos.epoch} ({pos.batches_per_epoch} batches per epoch) and {path}: order file not found; build it "
                f"with `olmo-data build-order CONFIG --first-epoch {pos.epoch}`, or point data.order_path / --order "
                "at the order file"
            )
        try:
            expected = self.source.fingerprint() if self.verify_data else None
            indices = read_order_range(
                path,
                start,
                stop,
                expected_fingerprint=expected,
                num_instances=self.num_instances,
                seed=self.seed,
                epoch=pos.epoch,
            )
        except DataError as e:
            if "past the end" in str(e):
                raise DataError(
                    f"step {pos.step} (batch index {pos.global_batch}) is past the end of the order: {e}"
                ) from e
            raise
        tokens, masks = self.source.get_batch(indices)
        return StepBatch(
            step=pos.step,
            global_batch=pos.global_batch,
            epoch=pos.epoch,
            batch_in_epoch=pos.batch_in_epoch,
            batches_per_epoch=pos.batches_per_epoch,
            instances=np.asarray(indices),
            tokens=tokens,
            label_mask=masks,
            fingerprint=batch_fingerprint(tokens),
            order_path=path,
        )

    def place(self, indices: np.ndarray) -> list[Placed]:
        files = self.source.files
        return [
            Placed(
                index=loc.index,
                path=loc.path,
                start=loc.token_offset,
                length=self.sequence_length,
                source=loc.source,
                metadata_path=files[loc.file_index].metadata_path,
                num_tokens=files[loc.file_index].num_tokens,
            )
            for loc in self.source.locate_many(indices)
        ]

    def documents(self, placed: Placed, docs: DocIndex) -> list[DocumentSpan] | None:
        end = placed.start + placed.length
        return docs.lookup(placed.path, placed.start, end, placed.metadata_path, placed.num_tokens)

    def instance_filter(self, instances: np.ndarray, tokens: np.ndarray, *, why: bool = False) -> Filtered | None:
        rule = self._filter
        if rule is None:
            return None
        masked = rule.filtered(tokens)
        caught = [rule.repetitions(row) if why and m else [] for row, m in zip(tokens, masked.tolist(), strict=True)]
        return Filtered(rule.settings(), masked, caught)

    def decoder(self, tokenizer: str | None) -> Tokenizer:
        return data_tokenizer(tokenizer, self.source)

    def token_files(self) -> list[TokenFile]:
        return list(self.source.files)

    def target_source(self) -> InstanceSource:
        return self.source

    def holding(self, file_index: int, start: int, end: int) -> list[Held]:
        src, L = self.source, self.sequence_length
        first = int(src.file_offsets[file_index])
        count = int(src.file_offsets[file_index + 1]) - first
        out = []
        for j in range(start // L, min((end - 1) // L, count - 1) + 1):
            for index in src.dataset_indices_of(first + j):  # a mix may hold a base instance several times
                out.append(Held(index, j * L, L, 0))
        return out

    def trained_at(self, instances: Sequence[int], first: int, last: int) -> dict[int, list[Trained]]:
        wanted = np.asarray(sorted(set(instances)), dtype=np.int64)
        out: dict[int, list[Trained]] = {int(i): [] for i in wanted}
        gbs, per_epoch = self.gbs, batches_per_epoch(self.num_instances, self.gbs)
        if per_epoch == 0:
            raise DataError(f"the data has {self.num_instances} instances, fewer than one global batch of {gbs}")
        if not len(wanted) or last < first:
            return out
        for epoch in range((first - 1) // per_epoch, (last - 1) // per_epoch + 1):
            lo_batch = max(first - 1 - epoch * per_epoch, 0)
            hi_batch = min(last - epoch * per_epoch, per_epoch)
            if hi_batch <= lo_batch:
                continue
            perm = self._epoch_order(epoch)
            start, stop = lo_batch * gbs, hi_batch * gbs
            if isinstance(perm, np.memmap):  # a file, not rebuilt: checked as every command checks what it reads
                found = self._search_file(perm, order_path_for_epoch(self.location, epoch), start, stop, wanted)
            else:
                found = np.flatnonzero(np.isin(perm[start:stop], wanted)) + start
            for p in found.tolist():
                out[int(perm[p])].append(Trained(epoch * per_epoch + p // gbs + 1, epoch, p // gbs, p % gbs))
        return out

    def _search_file(self, perm: np.memmap, path: str, start: int, stop: int, wanted: np.ndarray) -> np.ndarray:
        """Positions in [start, stop) of an order file holding one of `wanted`, read a block at a time
        (`search_order_file`: not mapped whole, an epoch is 2.9 GB at OLMo 3's scale), each block checked as
        `check_order_entries` checks a slice and against the blocks before it (one byte per instance), once per
        file and range: the verdict is kept (`verified_marker`), so a repeated trace only searches."""
        local, n = str(perm.filename), len(self.source)
        marker = verified_marker(local, f"{start}:{stop}")
        seen = None if already_verified(marker) else np.zeros(n, dtype=bool)

        def check(block: np.ndarray, lo: int) -> None:
            check_order_entries(path, block, lo, n, seen)

        checked = check if seen is not None else None
        found, _ = search_order_file(local, perm.dtype, start, stop, wanted, checked, perm.offset)
        if seen is not None:
            remember_verified(marker)
        return found

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's order file where it exists (checked against the data, as the trainer checks it), else the
        same permutation rebuilt in memory: PCG64(seed + epoch), what the trainer would write."""
        path = order_path_for_epoch(self.location, epoch)
        if is_remote(path) or os.path.exists(path):
            return load_order(path, self.source.fingerprint(), seed=self.seed, epoch=epoch)
        return build_order(len(self.source), self.seed, epoch)

    def supervised(self, instance: int, start: int, end: int) -> int | None:
        if not self._masked:
            return None
        _, masks = self.source.get_batch(np.array([instance]))
        return int(np.asarray(masks[0][start:end]).sum()) if masks is not None else None

    def stats(self, *, document_lengths: bool = True, progress: bool | None = None, **overrides: Any) -> Any:
        if not isinstance(self.config, str):
            raise DataError("stats of a run reads its config file: give the path of the config")
        return stats_for([self.config], document_lengths=document_lengths, progress=progress, **overrides)

    def format_stats(self, found: Any) -> str:
        return format_stats(found)

    def build_orders(
        self, *, epochs: int, first_epoch: int | None, destination: str | None, progress: bool | None = None
    ) -> Iterator[str]:
        first = 0 if first_epoch is None else first_epoch
        for summary in build_config_orders(self.cfg, epochs=epochs, first_epoch=first, location=destination):
            yield summary.line()

    def stage(self, first: int, last: int) -> Stage:
        config = self.config if isinstance(self.config, str) else ""
        return run_stage(config, self.cfg, first, last, None)

    def lineage(self, last_step: int | None) -> list[Stage]:
        if not isinstance(self.config, str):
            return []
        return read_lineage(self.config, self.cfg, fingerprint=self.data_fingerprint(), last_step=last_step)

    def source_labels(self, instances: Sequence[int]) -> list[str]:
        if self._sources is None:
            self._sources = Sources(self.source, self.cfg.data.paths)
        return [self._sources.labels[int(k)] for k in self._sources.of(list(instances))]
