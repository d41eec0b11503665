"""`read_run`: the one place that decides which trainer's rules read a run (`reader.RunData`'s implementations).

A config is read by OLMo-core's rules when it is the config.json an OLMo-core run saved, or a config of ours whose
`data.olmo_core` names one (our trainer on OLMo-core's batches: its steps are OLMo-core's batches, its save
folder and losses ours); every other config (ours, OLMo's YAML) by this project's and OLMo's rules.
"""

from __future__ import annotations

from typing import Any

from olmo_data.config import TrainConfig, olmo_core_form, read_run_config
from olmo_data.dataset import InstanceSource
from olmo_data.errors import DataError
from olmo_data.olmo_core import olmo_core_of, open_trained_on
from olmo_data.remote import apply_run_settings
from olmo_data.run.reader import RunData
from olmo_data.run.reader_olmo import OlmoRun
from olmo_data.run.reader_olmo_core import OlmoCoreRun


def read_run(
    config: str | dict[str, Any] | TrainConfig,
    *,
    order: str | None = None,
    source: InstanceSource | None = None,
    verify_data: bool = True,
) -> RunData:
    """The run `config` describes (a path, its keys, or a TrainConfig). `order` replaces where its orders are read
    (a directory, an order file, a URL); `source` is the instances of a config of ours when the caller has them
    open already; `verify_data=False` accepts an order recorded for data whose fingerprint differs."""
    if olmo_core_form(config) is not None:  # OLMo-core's own config.json
        core = olmo_core_of(config, work_dir=order)
        assert core is not None  # the form was found
        return OlmoCoreRun(config, core)
    cfg = read_run_config(config)
    apply_run_settings(cfg.data.remote_concurrency)  # its remote reads as the trainer makes them
    if cfg.data.olmo_core:  # a run of ours on OLMo-core's batches
        return OlmoCoreRun(config, open_trained_on(cfg, work_dir=order), cfg)
    return OlmoRun(config, cfg, source=source, order=order, verify_data=verify_data)


def check_own_records(config: str, command: str, records: str) -> None:
    """Refuse, in one line, a run whose trainer does not write this project's records (`records`, which `command`
    reads): the config.json of an OLMo-core run."""
    if olmo_core_form(config) is not None:
        raise DataError(
            f"{config}: an OLMo-core run's config.json; {command} reads the {records} this project's trainer writes, "
            "which OLMo-core does not: it applies to a run of ours trained on OLMo-core's batches (data.olmo_core); "
            "use inspect-batch for a step of this run"
        )
