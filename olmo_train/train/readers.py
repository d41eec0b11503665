"""`open_step_reader`: the one place the trainer decides whose rules cut a run's batches (`rows.StepReader`).

`data.olmo_core` names an OLMo-core run whose batches this run trains on (`olmo_core_data.CoreReader`, its batch
size written into the config first); otherwise `data.paths` / `data.mix` by this project's and OLMo's rules
(`own_data.OwnReader`).
"""

from __future__ import annotations

from olmo_data.config import ConfigError, TrainConfig
from olmo_train.distributed import Dist
from olmo_train.train.olmo_core_data import CoreReader, open_olmo_core_data
from olmo_train.train.own_data import OwnReader
from olmo_train.train.rows import StepReader


def open_step_reader(cfg: TrainConfig, d: Dist) -> StepReader:
    """The reader of this rank's rows for the run `cfg` describes, checked for the world size."""
    core = open_olmo_core_data(cfg, d.world_size) if cfg.data.olmo_core else None  # sets global_train_batch_size
    if cfg.global_train_batch_size % d.world_size:
        raise ConfigError(
            f"config key 'global_train_batch_size': {cfg.global_train_batch_size} is not divisible by the world size "
            f"{d.world_size}; every rank must get the same number of instances"
        )
    if core is not None:
        return CoreReader(core, d.rank, d.world_size, masking=cfg.model.document_masking)
    return OwnReader(cfg, d)
