"""The trainer's side of the data: a thin layer over `olmo_data` that turns a step number into this rank's
batch.

Everything about which instances a step trains (the order files, epochs, the rank split) is
`olmo_data.dataset.order`'s, the same code `olmo-data build-order` and `inspect-batch` run, so the trainer cannot
drift from the tools. Rank 0 reads the whole global batch (the others only their rows) to log the batch
fingerprint `inspect-batch` prints. The next `data.prefetch_batches` batches are read on background threads while
the current step computes, so that remote latency and retried requests stay off the step's path; they are
consumed strictly in step order, so what a step trains never depends on which read finished first.

With `data.instance_filter.enabled`, OLMo's rule for degenerate, repetitive instances
(`olmo_data.dataset.instance_filter`, the function inspect-batch applies) runs on this rank's rows on those same
threads; a caught instance stays in the
batch, so the order and the batch fingerprint do not change, and `labels_for` masks all of its targets.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from olmo_data.config import ConfigError, EvaluatorConfig, TrainConfig, parse_duration
from olmo_data.dataset import (
    MANIFEST_NAME,
    InstanceSource,
    Manifests,
    RepetitionFilter,
    Sources,
    batch_fingerprint,
    batches_per_epoch,
    default_order_location,
    ensure_order,
    global_batch_indices,
    instance_filter_of,
    open_dataset,
    order_path_for_epoch,
    rank_slice,
    run_steps,
    step_position,
)
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.olmo_core import data_fingerprint
from olmo_train.checkpoint import space
from olmo_train.distributed import Dist, raise_together
from olmo_train.train.documents import DocumentStarts, boundary_token
from olmo_train.train.olmo_core_data import CoreReader, CoreSources, open_olmo_core_data

log = logging.getLogger("olmo_train")


@dataclass
class Batch:
    step: int
    epoch: int
    input_ids: torch.Tensor  # (local batch, L) int64
    label_mask: torch.Tensor | None  # (local batch, L) bool; True = the token is a training target
    fingerprint: str | None  # of the global batch; rank 0 only
    wait_s: float = 0.0  # how long the step waited for it (near 0 when the read-ahead keeps up)
    doc_starts: torch.Tensor | None = None  # (local batch, L) bool, True where a document starts (document_masking)
    # (local batch,) bool, OLMo's instance_mask: False = caught by data.instance_filter (no target trains); None: off
    instance_mask: torch.Tensor | None = None
    sources: np.ndarray | None = None  # rank 0: the source (index into TrainData.sources.labels) of every position


def open_train_source(cfg: TrainConfig) -> InstanceSource:
    return open_dataset(
        cfg.data.paths or None,
        sequence_length=cfg.model.max_sequence_length,
        label_mask_paths=cfg.data.label_mask_paths,
        mix=cfg.data.mix,
        dtype=cfg.data.dtype,
    )


def check_vocabulary(source: InstanceSource, cfg: TrainConfig) -> None:
    """Refuse at start token data whose tokenizer has more ids than the model has embedding rows: an id past the
    last row otherwise fails deep in the embedding (a device-side assert on GPU), with no hint at the cause.
    Token files without a manifest cannot be checked."""
    rows = cfg.model.embedding_size or cfg.model.vocab_size
    key = "model.embedding_size" if cfg.model.embedding_size else "model.vocab_size"
    manifests = Manifests()  # one read per directory
    for file in source.files:
        directory, manifest = manifests.of_file(file.path)
        vocab = (manifest.get("tokenizer") or {}).get("vocab_size")
        if vocab is not None and int(vocab) > rows:
            raise ConfigError(
                f"config key '{key}': the model has {rows} embedding rows, but {directory}/{MANIFEST_NAME} says "
                f"the data's tokenizer has vocab_size {vocab} (token ids up to {int(vocab) - 1}); set {key} to at "
                f"least {vocab} or train on data made with the model's tokenizer"
            )


class TrainData:
    def __init__(self, cfg: TrainConfig, d: Dist) -> None:
        self.cfg, self.d = cfg, d
        # data.olmo_core: OLMo-core's batches (olmo_core_data), its batch size written into the config first
        core = open_olmo_core_data(cfg, d.world_size) if cfg.data.olmo_core else None
        self.core = CoreReader(core, d.rank, d.world_size, masking=cfg.model.document_masking) if core else None
        self.gbs = cfg.global_train_batch_size
        if self.gbs % d.world_size:
            raise ConfigError(
                f"config key 'global_train_batch_size': {self.gbs} is not divisible by the world size "
                f"{d.world_size}; every rank must get the same number of instances"
            )
        if cfg.data.remote_concurrency is not None:
            from olmo_data.remote import configure

            configure(concurrency=cfg.data.remote_concurrency)
        self.prefetch = cfg.data.prefetch_batches
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.prefetch), thread_name_prefix="olmo-train-data")
        self._pending: deque[tuple[int, Future[Batch]]] = deque()  # steps after the current one, in order
        self._epochs_ready: set[int] = set()
        self.sources: Sources | CoreSources
        self.documents: DocumentStarts | None = None
        self.instance_filter: RepetitionFilter | None = None
        if self.core is not None:
            self.num_instances = len(self.core.core.dataset)
            self.batches_per_epoch = batches_per_epoch(self.num_instances, self.gbs)
            self.fingerprint = data_fingerprint(self.core.core)
            self.sources = self.core.sources
            self.remote = any(is_remote(p) for p in self.core.core.dataset.paths)
            return
        self.source = open_train_source(cfg)
        check_vocabulary(self.source, cfg)
        self.num_instances = len(self.source)
        self.batches_per_epoch = batches_per_epoch(self.num_instances, self.gbs)
        if self.batches_per_epoch == 0:
            raise DataError(
                f"data.paths hold {self.num_instances} instances of {cfg.model.max_sequence_length} "
                f"tokens, fewer than one global batch of {self.gbs}; add data or lower "
                "global_train_batch_size"
            )
        self.fingerprint = self.source.fingerprint()
        self.sources = Sources(self.source, cfg.data.paths)  # labels for train/source/<label>/...
        self.documents = document_starts(self.source, cfg)
        self.instance_filter = instance_filter_of(cfg)
        self.order_location = cfg.data.order_path or default_order_location(cfg.save_folder)
        self.remote = any(is_remote(p) for f in self.source.files for p in (f.path, f.label_mask_path) if p)

    def total_steps(self) -> int:
        """max_duration in steps: steps as given, tokens rounded up to whole steps, epochs of full batches."""
        parse_duration(self.cfg.max_duration)  # a bad value is a ConfigError naming the key
        return run_steps(self.cfg, self.num_instances)

    def epoch_of(self, step: int) -> int:
        if self.core is not None:
            return self.core.epoch_of(step)
        return (step - 1) // self.batches_per_epoch

    def ensure_epoch(self, epoch: int) -> None:
        """Build the epoch's order on rank 0 (if absent) before any rank reads it. Collective."""
        if epoch in self._epochs_ready or self.core is not None:  # OLMo-core's orders: read or rebuilt in memory
            self._epochs_ready.add(epoch)
            return

        def build() -> None:
            if not self.d.is_main:
                return
            path = order_path_for_epoch(self.order_location, epoch)
            if self.cfg.force_load and os.path.exists(path):  # the user accepted other data: keep the order
                log.warning("force_load: using the existing order %s without checking its data fingerprint", path)
                return
            with space.refused_writes(Path(self.cfg.save_folder), f"the data order {path}"):  # e.g. a full disk
                ensure_order(self.order_location, self.source, self.cfg.seed, epoch)

        raise_together(build)  # also the point where the order exists for every rank
        self._epochs_ready.add(epoch)

    def batch(self, step: int) -> Batch:
        """This rank's part of step `step`'s global batch; reads the next `prefetch_batches` ones ahead."""
        self.ensure_epoch(self.epoch_of(step))
        while self._pending and self._pending[0][0] < step:  # not this run's path (a jump on resume)
            self._pending.popleft()[1].cancel()
        if self._pending and self._pending[0][0] != step:
            self._drop_pending()
        current = self._pending.popleft()[1] if self._pending else None
        nxt = self._pending[-1][0] + 1 if self._pending else step + 1
        while nxt <= step + self.prefetch and self.epoch_of(nxt) in self._epochs_ready:  # the order must exist
            self._pending.append((nxt, self._pool.submit(self._read, nxt)))
            nxt += 1
        t0 = time.perf_counter()
        batch = current.result() if current is not None else self._read(step)
        batch.wait_s = time.perf_counter() - t0
        return batch

    def remote_retries(self) -> int:
        """Failed remote reads that were retried so far in this process (a metric: a flaky network shows)."""
        from olmo_data.remote import remote_reader

        return remote_reader().retries

    def _drop_pending(self) -> None:
        while self._pending:
            self._pending.popleft()[1].cancel()

    def _read(self, step: int) -> Batch:
        if self.core is not None:
            rows = self.core.read(step)
            mask = rows.label_mask
            return Batch(
                step=step,
                epoch=rows.epoch,
                input_ids=torch.from_numpy(np.ascontiguousarray(rows.tokens)),
                label_mask=torch.from_numpy(np.ascontiguousarray(mask)) if mask is not None else None,
                fingerprint=rows.fingerprint,
                instance_mask=torch.from_numpy(rows.instance_mask) if rows.instance_mask is not None else None,
                doc_starts=torch.from_numpy(rows.doc_starts) if rows.doc_starts is not None else None,
                sources=rows.sources,
            )
        indices = global_batch_indices(
            self.order_location, step, self.gbs, num_instances=self.num_instances, seed=self.cfg.seed
        ).astype(np.int64)
        fingerprint, sources = None, None
        local = rank_slice(indices, self.d.rank, self.d.world_size)
        if self.d.is_main:
            tokens, masks = self.source.get_batch(indices)
            fingerprint = batch_fingerprint(tokens)
            sources = self.sources.of(indices)
            tokens = rank_slice(tokens, 0, self.d.world_size)
            masks = rank_slice(masks, 0, self.d.world_size) if masks is not None else None
        else:
            tokens, masks = self.source.get_batch(local)
        pos = step_position(step, self.gbs, self.num_instances)
        starts = self.documents.rows(local, tokens) if self.documents is not None else None
        keep = ~self.instance_filter.filtered(tokens) if self.instance_filter is not None else None
        return Batch(
            step=step,
            epoch=pos.epoch,
            input_ids=torch.from_numpy(np.ascontiguousarray(tokens)),
            label_mask=torch.from_numpy(np.ascontiguousarray(masks)) if masks is not None else None,
            fingerprint=fingerprint,
            doc_starts=torch.from_numpy(starts) if starts is not None else None,
            instance_mask=torch.from_numpy(keep) if keep is not None else None,
            sources=sources,
        )

    def close(self) -> None:
        self._drop_pending()
        self._pool.shutdown(wait=True, cancel_futures=True)


def labels_for(
    input_ids: torch.Tensor, label_mask: torch.Tensor | None, instance_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token targets, -100 where the label mask says not to train (OLMo: the mask of the target
    token) and on every row whose instance mask is False (OLMo's instance filter)."""
    labels = input_ids[:, 1:].clone()
    if label_mask is not None:
        labels.masked_fill_(~label_mask[:, 1:], -100)
    if instance_mask is not None:
        labels.masked_fill_(~instance_mask[:, None], -100)
    return labels


def document_starts(source: InstanceSource, cfg: TrainConfig) -> DocumentStarts | None:
    """With model.document_masking, where the source's documents start (None without it). The EOS token is
    resolved here from the data's manifests when the config leaves it unset, and written back into the config, so
    the run's saved config.yaml records the boundaries it trained with."""
    if not cfg.model.document_masking:
        return None
    manifests = Manifests()  # each directory's manifest read once for both
    cfg.model.eos_token_id = boundary_token(cfg.model.eos_token_id, [f.path for f in source.files], manifests)
    return DocumentStarts(source, cfg.model.eos_token_id, manifests)


EvalBatch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # input_ids, label_mask, doc_starts


def eval_batches(ev: EvaluatorConfig, cfg: TrainConfig, d: Dist) -> list[EvalBatch]:
    """This rank's share of a validation set: instances in file order, rank r taking r, r+W, ...; all ranks
    get the same number of batches (the tail that does not divide evenly is dropped), so collectives stay in
    step."""
    source = open_dataset(ev.paths, sequence_length=cfg.model.max_sequence_length, dtype=ev.dtype)
    check_vocabulary(source, cfg)
    per_batch = cfg.device_eval_batch_size * d.world_size
    n_batches = len(source) // per_batch
    if ev.max_batches is not None:
        n_batches = min(n_batches, ev.max_batches)
    if n_batches == 0:
        raise DataError(
            f"evaluator {ev.label!r}: {len(source)} instances are fewer than one eval batch of {per_batch} "
            "(device_eval_batch_size x world size); add data or lower device_eval_batch_size"
        )
    documents = document_starts(source, cfg)
    out: list[EvalBatch] = []
    for b in range(n_batches):
        indices = np.arange(b * per_batch, (b + 1) * per_batch)[d.rank :: d.world_size]
        tokens, masks = source.get_batch(indices)
        starts = documents.rows(indices, tokens) if documents is not None else None
        out.append(
            (
                torch.from_numpy(tokens),
                torch.from_numpy(masks) if masks is not None else None,
                torch.from_numpy(starts) if starts is not None else None,
            )
        )
    return out
