"""A checkpoint's trainer state (`TrainerState`, written last), and the save folder's names for the trainer.

Every file and directory name of a save folder and its checkpoints is spelled once, in `olmo_data/run/layout.py`
(the data tools read the same files back); this module re-exports them for the checkpoint package, so a reader of
the trainer finds the layout from here, and adds what only the trainer needs (the trainer state's fields, checks).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from olmo_data.errors import DataError, shown
from olmo_data.io import json_bytes
from olmo_data.run import (
    CHECKSUMS,
    CONFIG,
    DCP_METADATA,
    EXACT_FILE,
    INSTANCE_LOSS,
    LATEST,
    LATEST_UNSHARDED,
    METRICS,
    MODEL_FILE,
    OPTIM_FILE,
    REPLACED_PREFIX,
    RNG_DIR,
    SAVING_SUFFIX,
    TMP_PREFIX,
    TOKENIZER_FILE,
    TRAINER_STATE,
    WRITER_LOCK,
    latest_checkpoint,
    latest_link,
    list_checkpoints,
    metrics_aside,
    rng_file,
    step_dir,
)
from olmo_train.checkpoint.lineage import check_lineage


@dataclass
class TrainerState:
    """Where a run is. Everything needed to continue it exactly, besides model and optimizer tensors."""

    step: int = 0
    epoch: int = 0
    tokens_seen: int = 0
    instances_seen: int = 0
    world_size: int = 1
    global_train_batch_size: int = 0
    sequence_length: int = 0
    seed: int = 0
    data_fingerprint: str = ""
    run_name: str = ""
    wandb_run_id: str | None = None
    lineage: list[dict[str, Any]] = field(default_factory=list)  # where the weights came from (lineage.py)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TrainerState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})

    @classmethod
    def parse(cls, data: bytes, where: Path) -> TrainerState:
        """The state in the bytes of trainer_state.json, each field checked by type and value: a resume sets the
        step, the data position and the seed from them, so a string step or a negative count must stop here by
        key, not as a TypeError mid-resume or (for `verify`) not at all."""
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise DataError(f"{where}: not valid JSON ({e}); the checkpoint is damaged") from e
        except RecursionError as e:  # a lineage nested thousands deep (no real model has that many stages)
            raise DataError(f"{where}: nested too deeply to read (a damaged or crafted lineage?)") from e
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a mapping of trainer state fields, got {shown(obj)}")
        for f in fields(cls):
            if f.name not in obj:
                continue
            value = obj[f.name]
            if f.name == "lineage":
                check_lineage(value, str(where))
                continue
            if f.type == "int":
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= (f.name == "world_size")
                expected = "an integer of 1 or more" if f.name == "world_size" else "an integer of 0 or more"
            else:
                ok = isinstance(value, str) or (value is None and "None" in str(f.type))
                expected = "a string" + (" or null" if "None" in str(f.type) else "")
            if not ok:
                raise DataError(f"{where}: {f.name} must be {expected}, got {shown(value)}; the checkpoint is damaged")
        return cls.from_json(obj)

    def to_bytes(self) -> bytes:
        """The bytes of trainer_state.json (known before they are written, so checksums.json can list them)."""
        return json_bytes(asdict(self))


def is_unsharded(path: Path) -> bool:
    """Whether a complete checkpoint directory is unsharded (holds model.pt) rather than sharded."""
    return (path / MODEL_FILE).is_file()


__all__ = [
    "CHECKSUMS",
    "CONFIG",
    "DCP_METADATA",
    "EXACT_FILE",
    "INSTANCE_LOSS",
    "LATEST",
    "LATEST_UNSHARDED",
    "METRICS",
    "MODEL_FILE",
    "OPTIM_FILE",
    "REPLACED_PREFIX",
    "RNG_DIR",
    "SAVING_SUFFIX",
    "TMP_PREFIX",
    "TOKENIZER_FILE",
    "TRAINER_STATE",
    "WRITER_LOCK",
    "TrainerState",
    "is_unsharded",
    "latest_checkpoint",
    "latest_link",
    "list_checkpoints",
    "metrics_aside",
    "rng_file",
    "step_dir",
]
