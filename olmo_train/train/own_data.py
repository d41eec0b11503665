"""The trainer's reader of a run cut by this project's and OLMo's rules (`data.paths` / `data.mix`): a `StepReader`.

Which instances a step trains (the order files, epochs, the rank split) is `olmo_data.dataset.order`'s, the same
code `olmo-data build-order` and `inspect-batch` run, so the trainer cannot drift from the tools. Rank 0 reads the
whole global batch (the others only their rows) to log the batch fingerprint `inspect-batch` prints. With
`data.instance_filter.enabled`, OLMo's rule for degenerate, repetitive instances (`olmo_data.dataset.instance_filter`,
the function inspect-batch applies) runs on this rank's rows; a caught instance stays in the batch, so the order
and the batch fingerprint do not change, and `labels_for` masks all of its targets.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from olmo_data.config import ConfigError, TrainConfig
from olmo_data.dataset import (
    MANIFEST_NAME,
    InstanceSource,
    Manifests,
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
    step_position,
)
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_train.checkpoint import space
from olmo_train.distributed import Dist, raise_together
from olmo_train.train.documents import DocumentStarts, boundary_token
from olmo_train.train.rows import Rows

log = logging.getLogger("olmo_train")


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


def document_starts(source: InstanceSource, cfg: TrainConfig) -> DocumentStarts | None:
    """With model.document_masking, where the source's documents start (None without it). The EOS token is
    resolved here from the data's manifests when the config leaves it unset, and written back into the config, so
    the run's saved config.yaml records the boundaries it trained with."""
    if not cfg.model.document_masking:
        return None
    manifests = Manifests()  # each directory's manifest read once for both
    cfg.model.eos_token_id = boundary_token(cfg.model.eos_token_id, [f.path for f in source.files], manifests)
    return DocumentStarts(source, cfg.model.eos_token_id, manifests)


class OwnReader:
    """The rank's rows of each step from `data.paths` / `data.mix`, orders built on rank 0 where absent."""

    def __init__(self, cfg: TrainConfig, d: Dist) -> None:
        self.cfg, self.d = cfg, d
        self.gbs = cfg.global_train_batch_size
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

    def epoch_of(self, step: int) -> int:
        return (step - 1) // self.batches_per_epoch

    def ensure_epoch(self, epoch: int) -> None:
        """Build the epoch's order on rank 0 (if absent) before any rank reads it. Collective."""

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

    def read(self, step: int) -> Rows:
        indices = global_batch_indices(
            self.order_location, step, self.gbs, num_instances=self.num_instances, seed=self.cfg.seed
        ).astype("int64")
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
        return Rows(pos.epoch, tokens, masks, keep, fingerprint, sources, starts)
