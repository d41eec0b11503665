"""Training on an OLMo-core run's batches: `data.olmo_core: PATH/config.json`.

The step's global batch is OLMo-core's (`olmo_data.olmo_core`: its dataset, 1-based epoch orders, rank split),
so a run here replicates or continues an OLMo-core run's data order, and logs the same batch fingerprints
`inspect-batch` prints for that run. OLMo-core's global batch size counts tokens; here it becomes
`global_train_batch_size` (tokens / sequence length), written into the config so that config.yaml records it.
Its label mask (padded and packed instances, label mask files) and its instance filter's `instance_mask` come
with each batch, and `labels_for` masks them as for our own data.

A NumpyPackedFSLDataset's instance is whole documents packed together, then padding. Its documents are OLMo-core's
`doc_lens` of the row (`get_document_lengths`, the padding one document or, with a pad id equal to the EOS, one
per pad token), the lengths OLMo-core's loader yields with `dataset.generate_doc_lengths: true`:

* `model.document_masking: true` attends within those documents (each `doc_lens` entry starts a document of
  `Batch.doc_starts`): what OLMo-core 3.0.0's model does with `doc_lens`. It also restarts rotary positions at
  each (its RotaryEmbedding), as `model.document_positions: true` does here; within a document rotary attention
  depends only on relative positions, so either setting computes the same attention. Without
  generate_doc_lengths the same rule still gives the documents (OLMo-core's run then attended across them; a
  warning says the runs differ).
* `false`: the row is one causal sequence, as OLMo-core trains without generate_doc_lengths (with it, a warning).

`model.eos_token_id` is OLMo-core's tokenizer's when masking (set when unset; another one refused: the evaluators'
documents would end elsewhere than the training ones).

Sources (`train/source/<label>/...`): each file of the run's dataset is a source (a mixture's: its sources). A
packed instance's documents may come from several files of its source group (`source_group_size > 1`): it counts
for the file of its first document, the file `stats` counts it under (`PackedInstances.first_files`); so does an
interleaved instance (NumpyInterleavedFSLDataset: chunks of several documents, `InterleavedInstances.first_files`).

A NumpyVSLDataset run trains each step's bucket: rows of that step's length (up to model.max_sequence_length, the
run's longest), as many as OLMo-core's global batch of tokens holds, rank r taking the r-th of W consecutive blocks
as OLMo-core's VSL loader splits it (`Rows.rank_blocks`; the per-instance record gathers them back in batch order).

Refused at start, by name: a `BatchSizeSchedulerCallback` (the loop's learning rate, token counts and
checkpoints assume one batch size), a dataset class this trainer has no rule for (one sequence length per run),
and `model.document_masking` with a dataset other than NumpyPackedFSLDataset (its instances have no documents
OLMo-core numbers; our token-file index's do not follow them).
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from olmo_data.config import ConfigError, TrainConfig
from olmo_data.dataset import batch_fingerprint, rank_slice
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.olmo_core import OlmoCoreData, data_fingerprint, open_trained_on
from olmo_train.train.rows import Rows

log = logging.getLogger("olmo_train")

# the OlmoCoreRun.kind values this trainer has a rule for
TRAINABLE_KINDS = ("fsl", "padded", "packed", "interleaved", "composable", "vsl")


def open_olmo_core_data(cfg: TrainConfig, world_size: int) -> OlmoCoreData:
    """The OLMo-core data `data.olmo_core` names, checked for what this trainer can train on; sets
    `global_train_batch_size` from OLMo-core's global batch (tokens), and with document masking
    `model.eos_token_id` from OLMo-core's tokenizer."""
    core = open_trained_on(cfg)
    where = f"config key 'data.olmo_core': {cfg.data.olmo_core}"
    if core.run.batch_sizes:
        raise ConfigError(
            f"{where} changes its batch size during the run (trainer.callbacks: BatchSizeSchedulerCallback); "
            "training on it here is not supported (inspect-batch and trace read such a run)"
        )
    if core.run.kind not in TRAINABLE_KINDS:
        raise ConfigError(
            f"{where}: training here on its dataset ({core.run.kind}) is not covered; the trainer trains on "
            "OLMo-core's NumpyFSLDataset (and its mixture), NumpyPaddedFSLDataset, NumpyPackedFSLDataset, "
            "NumpyInterleavedFSLDataset, NumpyVSLDataset and its composable sources under ComposableDataLoader"
        )
    check_documents(cfg, core)
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


def check_documents(cfg: TrainConfig, core: OlmoCoreData) -> None:
    """model.document_masking against the run's dataset (see the module docstring): refused but for packed data,
    the EOS set from (or checked against) OLMo-core's, and a warning where the attention differs from the run's."""
    run, model = core.run, cfg.model
    if model.document_masking and run.kind != "packed":
        raise ConfigError(
            "config key 'model.document_masking': with data.olmo_core only for OLMo-core's NumpyPackedFSLDataset "
            "(its doc_lens); this run's instances have no documents OLMo-core numbers: set it to false"
        )
    if run.kind != "packed":
        return
    if model.document_masking:
        if model.eos_token_id is not None and model.eos_token_id != run.eos_token_id:
            raise ConfigError(
                f"config key 'model.eos_token_id': {model.eos_token_id}, but OLMo-core's run {run.source} ends "
                f"documents at dataset.tokenizer.eos_token_id {run.eos_token_id}; set it to {run.eos_token_id} "
                "or remove it"
            )
        model.eos_token_id = run.eos_token_id
    theirs = "within" if run.generate_doc_lengths else "across"
    ours = "within" if model.document_masking else "across"
    if theirs != ours:
        log.warning(
            "data.olmo_core: OLMo-core's run attended %s its packed documents (dataset.generate_doc_lengths: %s); "
            "with model.document_masking: %s this run attends %s them",
            theirs,
            str(run.generate_doc_lengths).lower(),
            str(model.document_masking).lower(),
            ours,
        )


def doc_starts(doc_lens: list[np.ndarray], length: int, instances: np.ndarray) -> np.ndarray:
    """(rows, length) bool, True where a document of OLMo-core's `doc_lens` starts (each row's first token too):
    what `Batch.doc_starts` holds for model.document_masking. `instances`: the rows' OLMo-core numbers."""
    starts = np.zeros((len(doc_lens), length), dtype=bool)
    for row, lens in enumerate(doc_lens):
        ends = np.cumsum(np.asarray(lens, dtype=np.int64))
        if len(ends) == 0 or ends[-1] != length or (np.asarray(lens) <= 0).any():
            raise DataError(
                f"OLMo-core packed instance {int(instances[row])}: doc_lens {np.asarray(lens).tolist()} do not split "
                f"its {length} tokens; check its packing files (inspect-batch shows its pieces)"
            )
        starts[row, ends[:-1]] = True
    starts[:, 0] = True
    return starts


class CoreSources:
    """Source labels of OLMo-core's data for train/source/... metrics: the mixture's sources, else one per file;
    a packed or interleaved instance is its first document's file's."""

    def __init__(self, core: OlmoCoreData) -> None:
        self.core = core
        self.loader = getattr(core.dataset, "loader", None)  # a composable run: its loader's sources are the sources
        if self.loader is not None:
            names = [s.label or f"source{k}" for k, s in enumerate(self.loader.sources)]
            self.labels = [n if names.count(n) == 1 else f"{n}.{k}" for k, n in enumerate(names)]
            self.by_location = False
            return
        names = [s if s is not None else p for s, p in zip(core.dataset.sources, core.dataset.paths, strict=True)]
        self.labels = list(dict.fromkeys(names))
        by_name = {n: i for i, n in enumerate(self.labels)}
        self.file_source = np.array([by_name[n] for n in names], dtype=np.int64)
        made = core.dataset.packed or core.dataset.interleaved
        # packed and interleaved instances are numbered as they were made (packed group after group, longest
        # documents first; interleaved after a permutation), not file after file: each by its first document's file
        self.first_files = made.first_files() if made is not None else None
        self.by_location = core.run.kind == "vsl"

    def of(self, indices: np.ndarray) -> np.ndarray:
        if self.by_location:  # VSL: instances numbered bucket by bucket; each piece is in one file
            files = np.array([loc.file_index for loc in self.core.locate(indices)], dtype=np.int64)
            return np.asarray(self.file_source[files], dtype=np.int64)
        if self.loader is not None:  # the loader source each instance is in (OLMo-core's batch metadata `source`)
            return np.array([self.loader.locate(int(i))[0] for i in indices], dtype=np.int64)
        if self.first_files is not None:
            files = self.first_files[np.asarray(indices, dtype=np.int64)]
        else:
            files = np.searchsorted(self.core.dataset.offsets, indices, side="right") - 1
        return np.asarray(self.file_source[files], dtype=np.int64)


class CoreReader:
    """Reads the rank's rows of OLMo-core's batch at a step; safe from the trainer's read-ahead threads (the epoch
    orders are built under a lock, once each). With `masking` (model.document_masking, packed data), each row's
    doc_starts."""

    def __init__(self, core: OlmoCoreData, rank: int, world_size: int, *, masking: bool = False) -> None:
        self.core, self.rank, self.world_size = core, rank, world_size
        self.sources = CoreSources(core)
        self.masking = masking
        self.num_instances = len(core.dataset)
        self.fingerprint = data_fingerprint(core)
        self.remote = any(is_remote(p) for p in core.dataset.paths)
        self._lock = threading.Lock()

    def ensure_epoch(self, epoch: int) -> None:
        """Nothing: OLMo-core's orders are read from its work_dir or rebuilt in memory, by each rank."""

    def epoch_of(self, step: int) -> int:
        with self._lock:
            return self.core.slot(step).epoch - 1

    def read(self, step: int) -> Rows:
        with self._lock:  # (with this rank and world size: OLMo-core's own rules for splitting the step's batch)
            batch = self.core.batch(step, self.rank, self.world_size, read=False)
        indices = batch.instances
        ds = self.core.dataset
        blocks = batch.rank_blocks  # VSL: rank r trains the r-th of W consecutive blocks, not every W-th row

        fingerprint, sources = None, None
        if self.rank == 0:
            tokens, masks = ds.get_batch(indices)
            fingerprint = batch_fingerprint(tokens)
            sources = self.sources.of(indices)
            local = rank_slice(indices, 0, self.world_size, blocks)
            tokens = rank_slice(tokens, 0, self.world_size, blocks)
            masks = rank_slice(masks, 0, self.world_size, blocks) if masks is not None else None
        else:
            local = rank_slice(indices, self.rank, self.world_size, blocks)
            tokens, masks = ds.get_batch(local)
        keep = self.core.instance_mask(local, tokens)
        starts = None
        if self.masking and ds.packed is not None:
            starts = doc_starts(ds.packed.doc_lens(local, tokens), tokens.shape[1], local)
        return Rows(batch.epoch - 1, tokens, masks, keep, fingerprint, sources, starts, rank_blocks=blocks)
