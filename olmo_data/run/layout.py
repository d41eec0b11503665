"""Every file and directory name of a run's save folder and of its checkpoints, in one module of the project.

A save folder holds:
  stepN/                  sharded: torch.distributed.checkpoint files (`.metadata` and its shards, model and
                          optimizer together), rng/rankR.pt, config.yaml, checksums.json, trainer_state.json
  stepN-unsharded/        one file per state: model.pt, optim.pt (relora.pt beside model.pt for a ReLoRA run),
                          rng/rank0.pt, config.yaml, checksums.json, trainer_state.json
  latest, latest-unsharded   symlinks to the newest complete checkpoint of each kind
  config.yaml             the run's resolved config
  metrics.jsonl           one JSON record per step, only ever appended to; metrics.N.jsonl: earlier ones set aside
  instance_loss.bin       each step's per-instance loss sums and supervised tokens (olmo_data.run.instance_loss),
                          kept across resume as metrics.jsonl is; instance_loss.N.bin: earlier ones set aside
  writer.lock             the run writing to the folder (host, pid, Slurm job, heartbeat): one writer at a time
A checkpoint made by `import-hf`, `import-olmo` or `import-olmo-core` is an unsharded one at step 0 with
tokenizer.json beside it (and optim.pt when import-olmo-core brought OLMo-core's optimizer state).

The trainer writes these files (olmo_train/checkpoint imports the names from here) and the data tools read them
back (`inspect-batch`, `spikes`, `lineage`, `trace`), so both sides find a run's files the same way: which save
folder a config belongs to, which checkpoint is its newest complete one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from olmo_data.config import TrainConfig, read_run_config
from olmo_data.errors import DataError
from olmo_data.io import is_remote

TRAINER_STATE = "trainer_state.json"  # written last: its presence marks a checkpoint complete
CHECKSUMS = "checksums.json"  # size and SHA-256 of every other file (olmo_train/checkpoint/integrity.py)
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
METRICS = "metrics.jsonl"  # one JSON record per trained step (olmo_train/train/metrics.py)
INSTANCE_LOSS = "instance_loss.bin"  # per-instance loss rows of every step (olmo_data.run.instance_loss)
WRITER_LOCK = "writer.lock"  # who is writing to the folder (olmo_train/checkpoint/lock.py); removed at the end
STEP_DIR = re.compile(r"^step(\d+)(-unsharded)?$")


def step_dir(step: int, unsharded: bool) -> str:
    """The directory name of the checkpoint of `step`."""
    return f"step{step}-unsharded" if unsharded else f"step{step}"


def rng_file(rank: int) -> str:
    """A rank's RNG state file, relative to its checkpoint."""
    return f"{RNG_DIR}/rank{rank}.pt"


def metrics_aside(n: int) -> str:
    """The name a metrics.jsonl is kept under when a new start cannot simply append to it (n = 1, 2, ...)."""
    return f"metrics.{n}.jsonl"


def instance_loss_aside(n: int) -> str:
    """The name an instance_loss.bin is kept under when a resumed run cannot simply append to it (n = 1, 2, ...)."""
    return f"instance_loss.{n}.bin"


def latest_link(unsharded: bool) -> str:
    return LATEST_UNSHARDED if unsharded else LATEST


def list_checkpoints(folder: str | os.PathLike[str]) -> list[tuple[int, bool, Path]]:
    """Complete checkpoints (holding trainer_state.json, written last) in a local save folder: (step, is_unsharded,
    path), oldest first. A remote or missing folder has none that can be listed here."""
    out = []
    if not is_remote(str(folder)) and os.path.isdir(folder):
        for p in Path(folder).iterdir():
            m = STEP_DIR.match(p.name)
            if m and not p.is_symlink() and (p / TRAINER_STATE).is_file():
                out.append((int(m.group(1)), bool(m.group(2)), p))
    return sorted(out)


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint, sharded preferred over unsharded at the same step."""
    found = list_checkpoints(folder)
    if not found:
        return None
    return max(found, key=lambda t: (t[0], not t[1]))[2]


def join(base: str, name: str) -> str:
    """A file in a local folder or under a URL."""
    return f"{base.rstrip('/')}/{name}" if is_remote(base) else os.path.join(base, name)


def save_folder_of(config: TrainConfig, config_path: str | None = None) -> str | None:
    """Where a training config's run writes (its save_folder), or, for a config file that sits in a save folder
    (the run's own config.yaml beside its instance_loss.bin), that folder."""
    if config_path is not None and not is_remote(config_path):
        here = os.path.dirname(os.path.abspath(config_path))
        if os.path.exists(os.path.join(here, INSTANCE_LOSS)):
            return here
    return config.save_folder or None


def run_files(run: str) -> tuple[str, str]:
    """(config path, save folder) of RUN as the commands take it: a save folder (its config.yaml) or a training
    config (its save_folder)."""
    if os.path.isdir(run):
        config = os.path.join(run, CONFIG)
        if not os.path.isfile(config):
            raise DataError(f"{run}: no {CONFIG} in it; give a run's save folder or its training config")
        return config, run
    if not os.path.isfile(run):
        raise DataError(f"{run}: not found; give a run's save folder or its training config")
    folder = save_folder_of(read_run_config(run), run)
    if folder is None:
        raise DataError(f"{run}: the config has no save_folder")
    return run, folder
