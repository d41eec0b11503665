"""Every file and directory name of a checkpoint and its save folder, and the trainer state written last.

A save folder holds:
  stepN/                  sharded: torch.distributed.checkpoint files (`.metadata` and its shards, model and
                          optimizer together), rng/rankR.pt, config.yaml, checksums.json, trainer_state.json
  stepN-unsharded/        one file per state: model.pt, optim.pt (relora.pt beside model.pt for a ReLoRA run),
                          rng/rank0.pt, config.yaml, checksums.json, trainer_state.json
  latest, latest-unsharded   symlinks to the newest complete checkpoint of each kind
  config.yaml             the run's resolved config
  metrics.jsonl           one JSON record per step, only ever appended to; metrics.N.jsonl: earlier ones set aside
  instance_loss.bin       each step's per-instance loss sums and supervised tokens (olmo_data.instance_loss), kept
                          across resume as metrics.jsonl is; instance_loss.N.bin: earlier ones set aside
  writer.lock             the run writing to the folder (host, pid, Slurm job, heartbeat): one writer at a time
A checkpoint made by `import-hf` or `import-olmo` is an unsharded one at step 0 with tokenizer.json beside it.

This is the one module that spells these names: the rest of the package (and the trainer, the converters) import
them from here, so a reader finds the whole layout on one screen and a rename cannot miss a reader.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from olmo_data import instance_loss
from olmo_data.errors import DataError, shown
from olmo_data.io import json_bytes
from olmo_train.checkpoint.lineage import check_lineage

TRAINER_STATE = "trainer_state.json"  # written last: its presence marks a checkpoint complete
CHECKSUMS = "checksums.json"  # size and SHA-256 of every other file (integrity.py)
CONFIG = "config.yaml"  # the run's resolved TrainConfig, in each checkpoint and in the save folder
MODEL_FILE = "model.pt"  # unsharded: the model's plain (merged) weights
OPTIM_FILE = "optim.pt"  # unsharded: the optimizer state
EXACT_FILE = "relora.pt"  # unsharded, beside model.pt: the unmerged state of linears trained through adapters
TOKENIZER_FILE = "tokenizer.json"  # an imported checkpoint's tokenizer
DCP_METADATA = ".metadata"  # sharded: torch.distributed.checkpoint's index of the shards
RNG_DIR = "rng"  # one RNG state file per rank
LATEST = "latest"
LATEST_UNSHARDED = "latest-unsharded"
TMP_PREFIX = ".tmp-"  # a checkpoint being written, renamed into place when complete
REPLACED_PREFIX = ".replaced-"  # a complete checkpoint moved aside while a new save of the same step takes its name
SAVING_SUFFIX = ".saving"  # marker of the save test hook's pause
METRICS = "metrics.jsonl"  # save folder: one JSON record per trained step (train/metrics.py)
INSTANCE_LOSS = instance_loss.FILE_NAME  # save folder: per-instance loss rows of every step (train/instance_losses.py)
WRITER_LOCK = "writer.lock"  # save folder: who is writing to it (lock.py); removed when that run ends
_STEP_DIR = re.compile(r"^step(\d+)(-unsharded)?$")


def step_dir(step: int, unsharded: bool) -> str:
    """The directory name of the checkpoint of `step`."""
    return f"step{step}-unsharded" if unsharded else f"step{step}"


def rng_file(rank: int) -> str:
    """A rank's RNG state file, relative to its checkpoint."""
    return f"{RNG_DIR}/rank{rank}.pt"


def metrics_aside(n: int) -> str:
    """The name a metrics.jsonl is kept under when a new start cannot simply append to it (n = 1, 2, ...)."""
    return f"metrics.{n}.jsonl"


def latest_link(unsharded: bool) -> str:
    return LATEST_UNSHARDED if unsharded else LATEST


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


def list_checkpoints(folder: Path) -> list[tuple[int, bool, Path]]:
    """Complete checkpoints in a save folder: (step, is_unsharded, path)."""
    out = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and not p.is_symlink() and (p / TRAINER_STATE).is_file():
                out.append((int(m.group(1)), bool(m.group(2)), p))
    return sorted(out)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint, sharded preferred over unsharded at the same step."""
    found = list_checkpoints(folder)
    if not found:
        return None
    return max(found, key=lambda t: (t[0], not t[1]))[2]


def is_unsharded(path: Path) -> bool:
    """Whether a complete checkpoint directory is unsharded (holds model.pt) rather than sharded."""
    return (path / MODEL_FILE).is_file()
