"""The training config as the data side reads it: the keys it needs, checked, with the trainer's defaults, and
the run length (`max_duration`) in steps.

Only PyYAML is used (not the trainer's config module) so that inspecting data never needs the trainer, and the
trainer parses `max_duration` with the same functions, so both count the same steps.
"""

from __future__ import annotations

import math
import re
from typing import Any

from olmo_data.errors import DataError, shown
from olmo_data.instance_filter import instance_filter_from_config
from olmo_data.io import read_yaml


def read_train_config(path: str) -> dict[str, Any]:
    """The keys of a training config that the data side needs, checked, with the trainer's defaults.

    Only PyYAML is used (not the trainer's config module) so that inspecting data never needs the trainer.
    """
    raw = read_yaml(path, "config file")
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a mapping of config keys at the top level")
    # the trainer's defaults (olmo_train/config.py) for keys a config leaves out
    raw.setdefault("seed", 6198)
    raw.setdefault("save_folder", "runs/olmo-run")
    raw.setdefault("global_train_batch_size", 512)
    for section in ("model", "data"):
        raw[section] = raw.get(section) or {}
        if not isinstance(raw[section], dict):
            raise DataError(f"{path}: {section} must be a mapping of keys, got {shown(raw[section])}")
    raw["model"].setdefault("max_sequence_length", 1024)
    for key in ("seed", "global_train_batch_size"):
        if not isinstance(raw[key], int) or isinstance(raw[key], bool):
            raise DataError(f"{path}: {key} must be an integer, got {shown(raw[key])}")
    length = raw["model"]["max_sequence_length"]
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise DataError(f"{path}: model.max_sequence_length must be a positive integer, got {shown(length)}")
    if not isinstance(raw["save_folder"], str):
        raise DataError(f"{path}: save_folder must be a string (a directory), got {shown(raw['save_folder'])}")
    data = raw["data"]
    for key in ("paths", "label_mask_paths"):
        value = data.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(p, str) for p in value)):
            raise DataError(
                f"{path}: data.{key} must be a list of paths (strings), got {shown(value)}; "
                f"write it as a YAML list, e.g. {key}: [runs/demo/tokens]"
            )
    for key in ("mix", "order_path"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise DataError(f"{path}: data.{key} must be a path (a string), got {shown(data[key])}")
    if data.get("dtype") is not None and data["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: data.dtype must be uint16 or uint32, got {shown(data['dtype'])}")
    instance_filter_from_config(data.get("instance_filter"), path)  # checked here; inspect-batch applies it
    return raw


def parse_duration(value: int | str) -> tuple[float, str]:
    """OLMo's max_duration: an int of steps, `...T` tokens or `...ep` epochs -> (amount, unit)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise DataError(f"duration {shown(value)}: must be positive")
        return float(value), "steps"
    text = str(value).strip()
    m = re.fullmatch(r"([0-9.eE+_]+)\s*(T|ep)?", text)
    if not m:
        raise DataError(f"duration {shown(value)}: expected steps (1000), tokens (2e9T) or epochs (3ep)")
    try:
        amount = float(m.group(1).replace("_", ""))
    except ValueError as e:
        raise DataError(f"duration {shown(value)}: expected steps (1000), tokens (2e9T) or epochs (3ep)") from e
    if not amount > 0:
        raise DataError(f"duration {shown(value)}: must be positive")
    if not math.isfinite(amount) or amount >= 2**63:  # 1e400 reads as infinity: no run of that many steps ends
        raise DataError(f"duration {shown(value)}: too large (at most 2**63)")
    return amount, {"T": "tokens", "ep": "epochs", None: "steps"}[m.group(2)]


def duration_steps(duration: int | str, *, global_batch_size: int, sequence_length: int, batches_per_epoch: int) -> int:
    """Training steps of an OLMo max_duration, as the trainer counts them: steps as given, tokens rounded up to
    whole steps, epochs as full batches (at least one step)."""
    amount, unit = parse_duration(duration)
    if unit == "tokens":
        return math.ceil(amount / (global_batch_size * sequence_length))
    if unit == "epochs":
        return max(1, round(amount * batches_per_epoch))
    return int(amount)
