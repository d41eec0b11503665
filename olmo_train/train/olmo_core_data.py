"""Training on an OLMo-core run's batches: `data.olmo_core: PATH/config.json`.

The step's global batch is OLMo-core's (`olmo_data.olmo_core`: its dataset, 1-based epoch orders, rank split),
so a run here replicates or continues an OLMo-core run's data order, and logs the same batch fingerprints
`inspect-batch` prints for that run. OLMo-core's global batch size counts tokens; here it becomes
`global_train_batch_size` (tokens / sequence length), written into the config so that config.yaml records it.
Its label mask (padded instances, label mask files) and its instance filter's `instance_mask` come with each
batch, and `labels_for` masks them as for our own data.

Refused at start, by name: a `BatchSizeSchedulerCallback` (the loop's learning rate, token counts and
checkpoints assume one batch size) and `model.document_masking` (its document starts are read from our
token-file index, which OLMo-core's instances, padded or mixed, do not follow), and a NumpyPackedFSLDataset (its
doc_lens are not yet turned into document masking here).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from olmo_data.config import ConfigError, TrainConfig
from olmo_data.dataset import batch_fingerprint, rank_slice
from olmo_data.olmo_core import OlmoCoreData, open_trained_on

log = logging.getLogger("olmo_train")


def open_olmo_core_data(cfg: TrainConfig, world_size: int) -> OlmoCoreData:
    """The OLMo-core data `data.olmo_core` names, checked for what this trainer can train on; sets
    `global_train_batch_size` from OLMo-core's global batch (tokens)."""
    core = open_trained_on(cfg)
    where = f"config key 'data.olmo_core': {cfg.data.olmo_core}"
    if core.run.batch_sizes:
        raise ConfigError(
            f"{where} changes its batch size during the run (trainer.callbacks: BatchSizeSchedulerCallback); "
            "training on it here is not supported (inspect-batch and trace read such a run)"
        )
    if core.run.kind == "packed":
        raise ConfigError(
            f"{where}: its dataset is OLMo-core's NumpyPackedFSLDataset; training here on its batches (their doc_lens "
            "as document masking, their sources per packed document) is not covered yet (inspect-batch, trace and "
            "stats read such a run)"
        )
    if cfg.model.document_masking:
        raise ConfigError(
            "config key 'model.document_masking': not supported with data.olmo_core (OLMo-core's instances do not "
            "follow our token-file document index); set it to false"
        )
    instances = core.run.global_batch_size // core.run.sequence_length
    if instances != cfg.global_train_batch_size:
        log.info(
            "data.olmo_core: global_train_batch_size %d, OLMo-core's global batch of %d tokens (was %d)",
            instances,
            core.run.global_batch_size,
            cfg.global_train_batch_size,
        )
        cfg.global_train_batch_size = instances
    if instances % world_size:
        raise ConfigError(f"{where}: its global batch of {instances} instances cannot be split over {world_size} ranks")
    return core


@dataclass
class CoreRows:
    """One rank's rows of a step's OLMo-core batch."""

    epoch: int  # 0-based, as this trainer counts epochs (OLMo-core's epoch - 1)
    tokens: np.ndarray
    label_mask: np.ndarray | None
    instance_mask: np.ndarray | None  # True: trained (OLMo-core's instance filter); None: no filter
    fingerprint: str | None  # of the global batch, rank 0 only
    sources: np.ndarray | None  # rank 0: each position's source number (into CoreSources.labels)


class CoreSources:
    """Source labels of OLMo-core's data for train/source/... metrics: the mixture's sources, else one per file."""

    def __init__(self, core: OlmoCoreData) -> None:
        self.core = core
        names = [s if s is not None else p for s, p in zip(core.dataset.sources, core.dataset.paths, strict=True)]
        self.labels = list(dict.fromkeys(names))
        by_name = {n: i for i, n in enumerate(self.labels)}
        self.file_source = np.array([by_name[n] for n in names], dtype=np.int64)

    def of(self, indices: np.ndarray) -> np.ndarray:
        files = np.searchsorted(self.core.dataset.offsets, indices, side="right") - 1
        return np.asarray(self.file_source[files], dtype=np.int64)


class CoreReader:
    """Reads the rank's rows of OLMo-core's batch at a step; safe from the trainer's read-ahead threads (the epoch
    orders are built under a lock, once each)."""

    def __init__(self, core: OlmoCoreData, rank: int, world_size: int) -> None:
        self.core, self.rank, self.world_size = core, rank, world_size
        self.sources = CoreSources(core)
        self._lock = threading.Lock()

    def epoch_of(self, step: int) -> int:
        with self._lock:
            return self.core.slot(step).epoch - 1

    def read(self, step: int) -> CoreRows:
        with self._lock:
            batch = self.core.batch(step, read=False)
        indices = batch.instances
        ds = self.core.dataset
        fingerprint, sources = None, None
        if self.rank == 0:
            tokens, masks = ds.get_batch(indices)
            fingerprint = batch_fingerprint(tokens)
            sources = self.sources.of(indices)
            local = rank_slice(indices, 0, self.world_size)
            tokens = rank_slice(tokens, 0, self.world_size)
            masks = rank_slice(masks, 0, self.world_size) if masks is not None else None
        else:
            local = rank_slice(indices, self.rank, self.world_size)
            tokens, masks = ds.get_batch(local)
        keep = self.core.instance_mask(local, tokens)
        return CoreRows(batch.epoch - 1, tokens, masks, keep, fingerprint, sources)
