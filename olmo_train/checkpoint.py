"""Checkpoints that survive being killed at any moment and load on any number of ranks.

Layout of `save_folder`:
  stepN/                  sharded: torch.distributed.checkpoint files (model + optimizer), rng/rankR.pt,
                          config.yaml, trainer_state.json
  stepN-unsharded/        one file per state: model.pt, optim.pt, plus rng/rank0.pt, config.yaml and
                          trainer_state.json
  latest, latest-unsharded   symlinks to the newest complete checkpoint of each kind
A checkpoint is written under `.tmp-stepN…` and renamed into place by rank 0 after every rank has finished
writing; `trainer_state.json` is written last, so a directory without it is never taken for a checkpoint, and
just before it `checksums.json`, the size and SHA-256 of every file (checkpoint_integrity), which a load checks
first. Nothing is unpickled freely (checkpoint_safety): a checkpoint from elsewhere runs no code when loaded.
Saving a step that already exists moves the old copy aside (`.replaced-stepN`) until the new one is in place. A
sharded checkpoint loads on a different world size (DCP reshards); an unsharded one loads anywhere. Each
checkpoint carries the run's resolved `config.yaml`, so it can be exported, unsharded or sampled from on its own
(older checkpoints without one fall back to the save folder's).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from olmo_data.errors import DataError
from olmo_data.io import is_remote, json_bytes
from olmo_train import checkpoint_integrity as integrity
from olmo_train import checkpoint_safety as safety
from olmo_train import lora
from olmo_train.config import TrainConfig, save_config
from olmo_train.distributed import Dist, all_gather_objects, barrier, broadcast_object, raise_together

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
CHECKSUMS = integrity.CHECKSUMS
CONFIG = "config.yaml"
_STEP_DIR = re.compile(r"^step(\d+)(-unsharded)?$")
# prefix of a complete checkpoint moved aside while a new save of the same step takes its name
_REPLACED = ".replaced-"
# test hook: seconds to sleep after the shards are written and before the checkpoint is made complete
PAUSE_ENV = "OLMO_TRAIN_TEST_SAVE_PAUSE"


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

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TrainerState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


def rng_state() -> dict[str, Any]:
    """Every RNG the run uses, in plain values and tensors (numpy's key as an int64 tensor), so that the file
    loads with `torch.load(weights_only=True)`."""
    numpy = np.random.get_state(legacy=False)
    key = torch.from_numpy(numpy["state"]["key"].astype(np.int64))
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {**numpy, "state": {**numpy["state"], "key": key}},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    numpy = state["numpy"]
    if isinstance(numpy, dict):  # saved by rng_state (older files hold numpy's legacy tuple, key as an array)
        numpy = {**numpy, "state": {**numpy["state"], "key": np.asarray(numpy["state"]["key"], dtype=np.uint32)}}
    random.setstate(state["python"])
    np.random.set_state(numpy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _load_rng(path: Path) -> dict[str, Any] | None:
    """A rank's saved RNG state, as plain data only. Files saved before the state was kept in tensors hold numpy's
    key as an array: the numpy globals a uint32 array pickles to are allowed for them, nothing else. A file that
    still does not load leaves the seeded RNG in place, with a warning."""
    array: list[Any] = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(array):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        log.warning("%s: not loadable as plain data (%s); keeping the seeded RNG state", path, type(e).__name__)
        return None
    return state if isinstance(state, dict) else None


def _begin(folder: Path, name: str, d: Dist, cfg: TrainConfig | None = None) -> Path:
    tmp = folder / f".tmp-{name}"
    if d.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        (tmp / "rng").mkdir()
        if cfg is not None:
            save_config(cfg, tmp / CONFIG)
    barrier()
    return tmp


def _finish(
    folder: Path,
    name: str,
    tmp: Path,
    state: TrainerState,
    pointer: str,
    keep: int,
    d: Dist,
    written: dict[str, integrity.Record] | None = None,
) -> Path:
    """Complete a checkpoint that every rank has written its part of (`written`: the files this rank wrote,
    with their records)."""
    pause = float(os.environ.get(PAUSE_ENV, 0) or 0)
    if pause and d.is_main:
        (folder / f"{name}.saving").write_text("paused inside a checkpoint write (test hook)\n")
        time.sleep(pause)
    parts = all_gather_objects(written or {})  # also the point where every rank has written its part
    final = folder / name
    if d.is_main:
        records = integrity.Recorder(tmp)
        for part in parts:
            records.files.update(cast(dict[str, integrity.Record], part))
        if (tmp / CONFIG).is_file():
            records.add_file(CONFIG)
        records.finish(
            TRAINER_STATE, json_bytes(asdict(state))
        )  # checksums.json, then the last file: marks the checkpoint complete
        replaced = folder / f"{_REPLACED}{name}"
        if final.exists():  # the same step saved again (e.g. preempted right after resuming): replace it,
            # keeping the old copy aside until the new one is in place (restored at start if killed between)
            if replaced.exists():
                shutil.rmtree(replaced)
            os.replace(final, replaced)
        os.replace(tmp, final)
        shutil.rmtree(replaced, ignore_errors=True)
        _point(folder / pointer, name)
        _prune(folder, unsharded=name.endswith("-unsharded"), keep=keep)
    barrier()
    return final


def _point(link: Path, target: str) -> None:
    tmp = link.with_name(f".tmp-{link.name}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _prune(folder: Path, unsharded: bool, keep: int) -> None:
    if keep < 0:
        return
    complete = [(step, path) for step, is_unsharded, path in list_checkpoints(folder) if is_unsharded == unsharded]
    for _, path in sorted(complete)[: max(0, len(complete) - keep)]:
        log.info("removing old checkpoint %s (keeping the last %d)", path, keep)
        shutil.rmtree(path, ignore_errors=True)


def save_sharded(
    folder: Path,
    model: nn.Module,
    optim: torch.optim.Optimizer,
    state: TrainerState,
    keep: int,
    d: Dist,
    cfg: TrainConfig | None = None,
) -> Path:
    name = f"step{state.step}"
    tmp = _begin(folder, name, d, cfg)
    model_sd, optim_sd = get_state_dict(model, optim)
    writer = integrity.HashingWriter(tmp)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
    records = integrity.Recorder(tmp, writer.written())
    records.torch_save(rng_state(), f"rng/rank{d.rank}.pt")
    return _finish(folder, name, tmp, state, "latest", keep, d, records.files)


def save_unsharded(
    folder: Path,
    model: nn.Module,
    optim: torch.optim.Optimizer,
    state: TrainerState,
    keep: int,
    d: Dist,
    cfg: TrainConfig | None = None,
) -> Path:
    name = f"step{state.step}-unsharded"
    tmp = _begin(folder, name, d, cfg)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)  # collectives: every rank takes part
    optim_sd = get_optimizer_state_dict(model, optim, options=opts)
    records = integrity.Recorder(tmp)
    if d.is_main:
        plain, exact = lora.split_state(model_sd)  # ReLoRA: merged weights in model.pt, the unmerged beside them
        records.torch_save(plain, "model.pt")
        if exact:
            records.torch_save(exact, lora.EXACT_FILE)
        records.torch_save(optim_sd, "optim.pt")
        records.torch_save(rng_state(), "rng/rank0.pt")
    return _finish(folder, name, tmp, state, "latest-unsharded", keep, d, records.files)


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


def remove_stale_temporaries(folder: Path) -> None:
    """Leftovers of a run killed while saving. A `.tmp-` directory may be unfinished: delete it. A `.replaced-`
    one is a complete checkpoint moved aside for a new save of the same step: delete it if the new one made it
    into place, else put it back, since it is then the only complete copy of that step."""
    for p in folder.glob(f"{_REPLACED}step*"):
        final = folder / p.name[len(_REPLACED) :]
        if (final / TRAINER_STATE).is_file():
            log.warning("removing %s, replaced by %s in an interrupted save", p, final)
            shutil.rmtree(p, ignore_errors=True)
        else:
            log.warning("restoring %s: a save that was replacing it was interrupted", final)
            if final.exists():
                shutil.rmtree(final)
            os.replace(p, final)
    for p in folder.glob(".tmp-step*"):
        log.warning("removing %s, an incomplete checkpoint of an interrupted save", p)
        shutil.rmtree(p, ignore_errors=True)
    for p in folder.glob("step*.saving"):
        p.unlink(missing_ok=True)


def read_trainer_state(path: Path) -> TrainerState:
    state_path = path / TRAINER_STATE
    if not state_path.is_file():
        raise DataError(f"{path}: not a complete checkpoint (no {TRAINER_STATE}); give a stepN directory")
    return TrainerState.from_json(json.loads(state_path.read_text()))


def localize(load_path: str, d: Dist) -> Path:
    """A local directory holding the checkpoint at `load_path` (remote ones fetched through cached-path)."""
    if not is_remote(load_path):
        path = Path(load_path).expanduser()
        if not path.is_dir():
            raise DataError(f"load_path {load_path}: no such checkpoint directory")
        safety.check_link(path)
        return path
    local: Path | None = None
    if d.local_rank == 0:
        local = _download(load_path.rstrip("/"))
    barrier()
    if d.local_rank != 0:
        local = _download(load_path.rstrip("/"))  # already in the cache: only resolves the paths
    assert local is not None
    return local


def _download(url: str) -> Path:
    """The checkpoint at `url`, copied into a cache entry of its own. Its checksums.json names the files to fetch
    (a checkpoint saved before it existed: its metadata does); each name is checked to stay inside the entry
    before anything is fetched or written, and each file against its record while it is copied, before it gets
    its name, so a damaged download is never used and a crafted one writes nowhere else."""
    from cached_path import cached_path

    def fetch(name: str) -> Path:
        try:
            return Path(cached_path(f"{url}/{name}"))
        except Exception as e:
            raise DataError(f"load_path {url}: cannot fetch {name} ({type(e).__name__}: {e})") from e

    def place(name: str) -> None:
        target = safety.confined(dest, name, url)
        expected = records.get(name) if records else None
        if target.exists() and (expected is None or target.stat().st_size == expected["size"]):
            return  # a file is only ever complete under its own name: copied aside, checked, then renamed
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part-{os.getpid()}")
        try:
            integrity.copy_checked(fetch(name), partial, expected, f"{url}/{name}")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def present(name: str) -> bool:
        try:
            fetch(name)
            return True
        except DataError:
            return False

    state = fetch(TRAINER_STATE)
    dest = state.parent / f"checkpoint-{hashlib.sha256(url.encode()).hexdigest()[:16]}"
    dest.mkdir(exist_ok=True)
    records: dict[str, integrity.Record] | None = None
    if present(CHECKSUMS):
        place(CHECKSUMS)
        records = integrity.read_checksums(dest)
    else:
        log.warning("%s: no %s (saved before checksums existed): the download cannot be checked", url, CHECKSUMS)
    if records is not None:
        names = sorted(records)
    else:  # checkpoints written before configs were saved in them have no config.yaml
        names = [TRAINER_STATE] + [CONFIG] * present(CONFIG)
        names += ["model.pt", "optim.pt"] if present("model.pt") else [safety.DCP_METADATA]
    if safety.DCP_METADATA in names:  # sharded: the shard names are the metadata's, read safely, checked
        place(safety.DCP_METADATA)
        shards = sorted(safety.storage_extents(safety.read_metadata(dest / safety.DCP_METADATA)))
        if records is not None:
            integrity.require_listed(dest, records, shards)
        names += [name for name in shards if name not in names]
    for name in names:
        place(name)
    return dest


def check_files(path: Path, *, weights_only: bool = False, rank: int = 0, world_size: int = 1) -> list[str]:
    """Before anything of a complete checkpoint is read: its files against its checksums.json (each of
    `world_size` ranks a share; the optimizer state left out with `weights_only`), and a sharded one's metadata
    read safely and each shard it names present and long enough. Returns the shard names (none if unsharded)."""
    records = integrity.verify(path, skip=["optim.pt"] if weights_only else [], rank=rank, world_size=world_size)
    shards: list[str] = []
    if (path / "model.pt").is_file():
        reads = ["model.pt", *([] if weights_only or not (path / "optim.pt").is_file() else ["optim.pt"])]
        reads += [lora.EXACT_FILE] if (path / lora.EXACT_FILE).is_file() else []
    else:
        metadata = path / safety.DCP_METADATA
        shards = safety.check_shard_files(metadata, safety.read_metadata(metadata))
        reads = [safety.DCP_METADATA, *shards]
    if records is not None:
        rng = [f"rng/{p.name}" for p in (path / "rng").glob("rank*.pt")]
        integrity.require_listed(path, records, [TRAINER_STATE, *reads, *sorted(rng)])
    return shards


def load_checkpoint(
    path: Path, model: nn.Module, optim: torch.optim.Optimizer | None, d: Dist, *, restore_rng: bool = True
) -> TrainerState:
    """Load weights (and optimizer state unless `optim` is None) from a sharded or unsharded checkpoint, once its
    files are checked (`check_files`); no file of it is unpickled freely."""
    state = read_trainer_state(path)
    if (path / "model.pt").is_file() and optim is not None and not (path / "optim.pt").is_file():
        # weights only (`unshard --model-only`)
        raise DataError(
            f"{path / 'optim.pt'}: no optimizer state in this checkpoint, so a run cannot continue from it; "
            f"start a fresh run from its weights with --load_path={path} --reset_trainer_state"
        )
    raise_together(lambda: check_files(path, weights_only=optim is None, rank=d.rank, world_size=d.world_size))
    if optim is not None:
        raise_together(lambda: lora.check_resume(path, model))
    if optim is None and (lora.has_adapters(model) or lora.checkpoint_adapters(path)):
        lora.load_merged_weights(path, model)  # weights only, into or out of ReLoRA: merged, adapters afresh
    elif (path / "model.pt").is_file():
        opts = StateDictOptions(full_state_dict=True)
        model_sd = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        set_model_state_dict(model, lora.with_exact_state(path, model_sd, model), options=opts)
        if optim is not None:
            optim_sd = torch.load(path / "optim.pt", map_location="cpu", weights_only=True)
            set_optimizer_state_dict(model, optim, optim_sd, options=opts)
    elif optim is None:
        model_sd = get_model_state_dict(model)
        safety.load_sharded(path, {"model": model_sd})
        set_model_state_dict(model, model_sd)
    else:
        model_sd, optim_sd = get_state_dict(model, optim)
        safety.load_sharded(path, {"model": model_sd, "optim": optim_sd})
        set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)
    rng_file = path / "rng" / f"rank{d.rank}.pt"
    if restore_rng and rng_file.is_file():  # a rank that did not exist in the saving run keeps its seeded RNG
        rng = _load_rng(rng_file)
        if rng is not None:
            set_rng_state(rng)
    return state


def agree_on_checkpoint(candidate: Path | None) -> Path | None:
    """Rank 0's choice, so that every rank loads the same checkpoint even if they see the filesystem
    differently."""
    chosen = broadcast_object(str(candidate) if candidate else None)
    return Path(chosen) if isinstance(chosen, str) else None
