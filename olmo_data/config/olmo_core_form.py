"""Which configs are an OLMo-core run's: the `config.json` its `ConfigSaverCallback` writes beside checkpoints.

Every config object OLMo-core saves names its class under `_CLASS_` (`olmo_core.data.numpy_dataset.…`), so the
form is told by the `dataset` and `data_loader` sections alone. The data commands (`inspect-batch`, `trace`,
`stats`, `build-order`) ask here first and read such a run through `olmo_data.olmo_core`; everything
else that reads a run's config (`read_run_config`) refuses it in one line naming what does read it, rather than
failing on a missing `data.paths`. This module only recognises the form: OLMo-core's rules live above the
config package (`olmo_data.olmo_core` needs the dataset package, which needs this one).
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from olmo_data.config.schema import ConfigError

CLASS_KEY = "_CLASS_"
READ_BY = "olmo-data inspect-batch, trace, stats and build-order"  # the commands that take it as it is


def is_olmo_core_form(raw: Any) -> bool:
    """Whether parsed config keys are an OLMo-core run's (its dataset or data_loader names an olmo_core class)."""
    if not isinstance(raw, dict):
        return False
    sections = [raw.get(k) for k in ("dataset", "data_loader")]
    return any(isinstance(s, dict) and str(s.get(CLASS_KEY, "")).startswith("olmo_core.") for s in sections)


def olmo_core_form(config: Any) -> dict[str, Any] | None:
    """The parsed keys of `config` (a path, or keys already parsed) when it is an OLMo-core run's config.json,
    else None. A path that cannot be read or parsed is None too: the reader of our own form says what is wrong."""
    raw: Any = config
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, "rb") as f:
                head = f.read(1)
                f.seek(0)
                text = f.read().decode("utf-8")
            raw = json.loads(text) if head == b"{" else yaml.safe_load(text)
        except RecursionError as e:  # no reader can parse it: say so in one line, not as a traceback
            raise ConfigError(
                f"{path}: nested too deeply to read (objects or arrays inside each other thousands of levels deep); "
                "not a config any trainer saves"
            ) from e
        except json.JSONDecodeError as e:
            if path.endswith(".json"):  # an OLMo-core config.json cut short: where it stops, in one line
                raise ConfigError(
                    f"{path}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno}; a truncated copy?)"
                ) from e
            return None
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
            return None
    return raw if is_olmo_core_form(raw) else None


def refuse_olmo_core_form(raw: Any, source: str) -> None:
    """Stop a reader of our config form on an OLMo-core config.json, saying which commands read one and how the
    trainer trains on its batches."""
    if is_olmo_core_form(raw):
        raise ConfigError(
            f"{source}: this is the config.json of an OLMo-core run, not a config of ours: {READ_BY} read it as "
            "it is; to train on its batches here, name it as data.olmo_core in a config of ours"
        )
