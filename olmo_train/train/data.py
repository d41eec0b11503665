"""The trainer's side of the data: a thin layer over `olmo_data` that turns a step number into this rank's
batch.

Whose rules cut the run's batches is decided once (`readers.open_step_reader`: `own_data.OwnReader` for
`data.paths` / `data.mix`, `olmo_core_data.CoreReader` for `data.olmo_core`); this module knows neither. The next
`data.prefetch_batches` batches are read on background threads while the current step computes, so that remote
latency and retried requests stay off the step's path; they are consumed strictly in step order, so what a step
trains never depends on which read finished first. Validation sets (`eval_batches`) are read here too.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from olmo_data.config import EvaluatorConfig, TrainConfig, parse_duration
from olmo_data.dataset import batches_per_epoch, open_dataset, run_steps
from olmo_data.errors import DataError
from olmo_train.distributed import Dist
from olmo_train.train.own_data import check_vocabulary, document_starts
from olmo_train.train.readers import open_step_reader

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
    rank_blocks: bool = False  # this rank's rows are the r-th of W consecutive blocks of the batch (VSL)


class TrainData:
    def __init__(self, cfg: TrainConfig, d: Dist) -> None:
        self.cfg, self.d = cfg, d
        if cfg.data.remote_concurrency is not None:
            from olmo_data.remote import configure

            configure(concurrency=cfg.data.remote_concurrency)
        self.reader = open_step_reader(cfg, d)  # may write global_train_batch_size (OLMo-core's batch, in tokens)
        self.gbs = cfg.global_train_batch_size
        self.num_instances = self.reader.num_instances
        self.batches_per_epoch = batches_per_epoch(self.num_instances, self.gbs)
        self.fingerprint = self.reader.fingerprint
        self.sources = self.reader.sources
        self.remote = self.reader.remote
        self.prefetch = cfg.data.prefetch_batches
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.prefetch), thread_name_prefix="olmo-train-data")
        self._pending: deque[tuple[int, Future[Batch]]] = deque()  # steps after the current one, in order
        self._epochs_ready: set[int] = set()

    def total_steps(self) -> int:
        """max_duration in steps: steps as given, tokens rounded up to whole steps, epochs of full batches."""
        parse_duration(self.cfg.max_duration)  # a bad value is a ConfigError naming the key
        return run_steps(self.cfg, self.num_instances)

    def epoch_of(self, step: int) -> int:
        return self.reader.epoch_of(step)

    def ensure_epoch(self, epoch: int) -> None:
        """What the epoch needs before any rank reads it (its order, built on rank 0). Collective."""
        if epoch not in self._epochs_ready:
            self.reader.ensure_epoch(epoch)
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
        rows = self.reader.read(step)

        def tensor(a: np.ndarray | None) -> torch.Tensor | None:
            return torch.from_numpy(np.ascontiguousarray(a)) if a is not None else None

        return Batch(
            step=step,
            epoch=rows.epoch,
            input_ids=torch.from_numpy(np.ascontiguousarray(rows.tokens)),
            label_mask=tensor(rows.label_mask),
            fingerprint=rows.fingerprint,
            doc_starts=tensor(rows.doc_starts),
            instance_mask=tensor(rows.instance_mask),
            sources=rows.sources,
            rank_blocks=rows.rank_blocks,
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
