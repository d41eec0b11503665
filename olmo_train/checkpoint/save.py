"""Saving checkpoints that survive being killed at any moment and load on any number of ranks.

A checkpoint is written under `.tmp-stepN…` and renamed into place by rank 0 after every rank has finished
writing; `trainer_state.json` is written last, so a directory without it is never taken for a checkpoint, and
just before it `checksums.json`, the size and SHA-256 of every file (integrity.py), which a load checks first.
Saving a step that already exists moves the old copy aside (`.replaced-stepN`) until the new one is in place. Each
checkpoint carries the run's resolved `config.yaml`, so it can be exported, unsharded or sampled from on its own.
The names of every file are in layout.py.

A write the file system refuses (a full disk, a quota, read-only, no permission) on any rank ends the save on every
rank together with one line (space.py): the partial checkpoint is removed at once, so it cannot keep the disk full,
and the last complete checkpoint stays the one a rerun resumes from.

A model whose training state holds more than its plain weights (ReLoRA's adapters) passes `split`, which divides
its full state into the plain weights an unsharded checkpoint keeps in model.pt and the exact state beside them
(relora.pt); this package knows nothing of adapters.

`BackgroundSaves` (`save_async: true`) writes the shards of a sharded save in a thread and completes the checkpoint
the same way (`finish_save`) once they are written: the same files, checksums and publication, only later.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
)

from olmo_data.config import TrainConfig, save_config
from olmo_data.errors import DataError
from olmo_train.checkpoint import integrity, links
from olmo_train.checkpoint.layout import (
    CHECKSUMS,
    CONFIG,
    EXACT_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    REPLACED_PREFIX,
    RNG_DIR,
    SAVING_SUFFIX,
    TMP_PREFIX,
    TRAINER_STATE,
    TrainerState,
    latest_link,
    list_checkpoints,
    rng_file,
    step_dir,
)
from olmo_train.checkpoint.space import SaveGuard, refusal, refused_message, warn_if_short
from olmo_train.distributed import Dist, all_gather_objects

log = logging.getLogger(__name__)

# test hooks: seconds for rank 0 to sleep inside a save (after writing `step.saving`), so a test can kill it there;
# where: "written" (every rank's files written, before checksums.json; the default), "shards" (after the DCP shards
# or model.pt, before the rest), "checksums" (after checksums.json, before trainer_state.json), "rename" (the
# checkpoint complete under its temporary name, before the rename), "background" (an asynchronous save: the shards
# written by the background thread, before the loop completes it; the loop keeps training meanwhile)
PAUSE_ENV = "OLMO_TRAIN_TEST_SAVE_PAUSE"
PAUSE_AT_ENV = "OLMO_TRAIN_TEST_SAVE_PAUSE_AT"

StateSplit = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]


def plain_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The split of a model with nothing beyond its plain weights: all of it in model.pt, nothing beside."""
    return state, {}


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


def _test_pause(moment: str, folder: Path, name: str, d: Dist) -> None:
    seconds = float(os.environ.get(PAUSE_ENV, 0) or 0)
    if seconds and d.is_main and os.environ.get(PAUSE_AT_ENV, "written") == moment:
        (folder / f"{name}{SAVING_SUFFIX}").write_text(f"paused inside a checkpoint write ({moment}; test hook)\n")
        time.sleep(seconds)


def begin_save(folder: Path, name: str, d: Dist, cfg: TrainConfig | None = None, *, unsharded: bool = False) -> Path:
    """The temporary directory of checkpoint `name`, made by rank 0 with the run's config in it; first a warning
    if the folder has less space free than the last checkpoint of the kind took."""
    tmp = folder / f"{TMP_PREFIX}{name}"
    guard = SaveGuard(folder, name, tmp, d, unsharded)
    guard.what = f"the directory and {CONFIG}"

    def start() -> None:
        if not d.is_main:
            return
        warn_if_short(folder, unsharded)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        (tmp / RNG_DIR).mkdir()
        if cfg is not None:
            save_config(cfg, tmp / CONFIG)

    guard.together(start)
    return tmp


def finish_save(
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
    _test_pause("written", folder, name, d)
    parts = all_gather_objects(written or {})  # also the point where every rank has written its part
    final = folder / name
    unsharded = name == step_dir(state.step, unsharded=True)
    guard = SaveGuard(folder, name, tmp, d, unsharded)
    guard.what = f"{CHECKSUMS} and {TRAINER_STATE}"

    def complete() -> None:
        if not d.is_main:
            return
        records = integrity.Recorder(tmp)
        for part in parts:
            records.files.update(cast(dict[str, integrity.Record], part))
        if (tmp / CONFIG).is_file():
            records.add_file(CONFIG)
        # checksums.json, then the last file: marks it complete
        records.finish(TRAINER_STATE, state.to_bytes(), between=lambda: _test_pause("checksums", folder, name, d))
        _test_pause("rename", folder, name, d)
        replaced = folder / f"{REPLACED_PREFIX}{name}"
        if final.exists():  # the same step saved again (e.g. preempted right after resuming): replace it,
            # keeping the old copy aside until the new one is in place (restored at start if killed between)
            if replaced.exists():
                shutil.rmtree(replaced)
            os.replace(final, replaced)
        os.replace(tmp, final)
        shutil.rmtree(replaced, ignore_errors=True)
        guard.what = f"the link {pointer}"
        links.point(folder / pointer, name)
        _prune(folder, unsharded=unsharded, keep=keep)

    guard.together(complete)  # also the point where rank 0 has made the checkpoint complete
    return final


def _prune(folder: Path, unsharded: bool, keep: int) -> None:
    """Remove all but the newest `keep` complete checkpoints of a kind (-1: keep all). The one just saved always
    stays: a keep of 0 (refused in a config) means 1 here, never none."""
    if keep < 0:
        return
    keep = max(keep, 1)
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
    name = step_dir(state.step, unsharded=False)
    tmp = begin_save(folder, name, d, cfg)
    model_sd, optim_sd = get_state_dict(model, optim)
    guard = SaveGuard(folder, name, tmp, d, unsharded=False)

    def write() -> dict[str, integrity.Record]:
        guard.what = "the model and optimizer shards"
        writer = integrity.HashingWriter(tmp)
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)  # a refusal raises on every rank
        _test_pause("shards", folder, name, d)
        records = integrity.Recorder(tmp, writer.written())
        guard.what = f"the RNG state {rng_file(d.rank)}"
        records.torch_save(rng_state(), rng_file(d.rank))
        return records.files

    written = guard.together(write)
    return finish_save(folder, name, tmp, state, latest_link(False), keep, d, written)


def save_unsharded(
    folder: Path,
    model: nn.Module,
    optim: torch.optim.Optimizer,
    state: TrainerState,
    keep: int,
    d: Dist,
    cfg: TrainConfig | None = None,
    split: StateSplit = plain_state,
) -> Path:
    name = step_dir(state.step, unsharded=True)
    tmp = begin_save(folder, name, d, cfg, unsharded=True)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)  # collectives: every rank takes part
    optim_sd = get_optimizer_state_dict(model, optim, options=opts)
    records = integrity.Recorder(tmp)
    guard = SaveGuard(folder, name, tmp, d, unsharded=True)

    def write() -> None:
        if not d.is_main:
            return
        plain, exact = split(model_sd)  # ReLoRA: merged weights in model.pt, the unmerged beside them
        files = [(MODEL_FILE, plain), *([(EXACT_FILE, exact)] if exact else []), (OPTIM_FILE, optim_sd)]
        for file, obj in [*files, (rng_file(0), rng_state())]:
            guard.what = file
            records.torch_save(obj, file)
            if file == MODEL_FILE:
                _test_pause("shards", folder, name, d)

    guard.together(write)
    return finish_save(folder, name, tmp, state, latest_link(True), keep, d, records.files)


class _PausingWriter(integrity.HashingWriter):
    """The HashingWriter whose `finish` (DCP's metadata, written by the coordinator in the background thread)
    ends with the test pause "background", so a test can kill a run while a save is still in flight."""

    def __init__(self, path: Path, folder: Path, name: str, d: Dist) -> None:
        super().__init__(path)
        self.at = (folder, name, d)

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        _test_pause("background", *self.at)


@dataclass
class _InFlight:
    """A sharded save whose shards are being written in the background; the rest (checksums, trainer state,
    rename, link, pruning) is done by `BackgroundSaves.wait`."""

    folder: Path
    name: str
    tmp: Path
    state: TrainerState  # a copy: the loop goes on changing its own
    keep: int
    writer: integrity.HashingWriter
    rng: dict[str, integrity.Record]
    future: Future[Any]


class BackgroundSaves:
    """Sharded saves written by DCP's `async_save` in a background thread (`save_async: true`), at most one in
    flight. `start` blocks only while tensors are staged to host memory (and for the small synchronous parts:
    the directory, config.yaml, the RNG state); `wait` completes the save exactly as `save_sharded` does
    (checksums.json, trainer_state.json, rename, `latest`, pruning). The loop calls `wait` before the next save
    and at the end of the run (also when preempted); a run killed before then leaves a `.tmp-` directory, removed
    at the next start, and resumes from the last complete checkpoint.

    The background thread's collectives run on a process group of their own (gloo), so they never interleave
    with the loop's collectives on the default group; every rank creates it at its first save, together."""

    def __init__(self, d: Dist) -> None:
        self.d = d
        self.group: dist.ProcessGroup | None = None
        self.in_flight: _InFlight | None = None

    def start(
        self,
        folder: Path,
        model: nn.Module,
        optim: torch.optim.Optimizer,
        state: TrainerState,
        keep: int,
        cfg: TrainConfig | None = None,
    ) -> Path:
        """Begin saving `state.step`; returns the temporary directory being written."""
        self.wait()  # at most one save in flight
        d = self.d
        if self.group is None:
            self.group = dist.new_group(backend="gloo")
        name = step_dir(state.step, unsharded=False)
        tmp = begin_save(folder, name, d, cfg)
        model_sd, optim_sd = get_state_dict(model, optim)
        guard = SaveGuard(folder, name, tmp, d, unsharded=False)
        writer = _PausingWriter(tmp, folder, name, d)

        def stage() -> tuple[Future[Any], dict[str, integrity.Record]]:
            guard.what = f"the RNG state {rng_file(d.rank)}"
            records = integrity.Recorder(tmp)
            records.torch_save(rng_state(), rng_file(d.rank))
            guard.what = "the staged copy of the model and optimizer"
            future = dcp.async_save(
                {"model": model_sd, "optim": optim_sd}, storage_writer=writer, process_group=self.group
            )
            return cast("Future[Any]", future), records.files

        future, rng = guard.together(stage)
        self.in_flight = _InFlight(folder, name, tmp, replace(state), keep, writer, rng, future)
        return tmp

    def wait(self) -> Path | None:
        """Complete the save in flight, if any (a collective: every rank calls it at the same point); returns
        the checkpoint."""
        job, self.in_flight = self.in_flight, None
        if job is None:
            return None
        guard = SaveGuard(job.folder, job.name, job.tmp, self.d, unsharded=False)
        guard.what = "the model and optimizer shards (written in the background)"

        def written() -> dict[str, integrity.Record]:
            job.future.result()  # a refusal raises here, on every rank
            return {**job.writer.written(), **job.rng}

        records = guard.together(written)
        final = finish_save(job.folder, job.name, job.tmp, job.state, latest_link(False), job.keep, self.d, records)
        log.info("saved %s (written in the background)", final)
        return final

    def abandon(self, error: BaseException, timeout_s: float = 300.0) -> None:
        """The run is failing with `error` while a save may be in flight: wait for its writes (at most `timeout_s`;
        no collective, since other ranks may not get here), remove its `.tmp-stepN` (on a full disk it holds the
        very space that is missing) and, when the background writes were refused too, raise that refusal: the save
        filled the disk, the write that met it next (metrics.jsonl...) did not. Else `error` stands."""
        job, self.in_flight = self.in_flight, None
        if job is None:
            return
        try:
            job.future.result(timeout=timeout_s)
            cause: BaseException | None = None
        except BaseException as e:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
            cause = e
        shutil.rmtree(job.tmp, ignore_errors=True)
        code = None if cause is None else refusal(cause, job.folder)
        if code is not None:
            what = f"the model and optimizer shards of {job.name} (written in the background)"
            raise DataError(refused_message(job.folder, what, code, True, unsharded=False)) from cause
        log.warning("%s: the save in flight was abandoned, the run failing (%s)", job.tmp, type(error).__name__)


def remove_stale_temporaries(folder: Path) -> None:
    """Leftovers of a run killed while saving, and `latest` links that a copy of the folder made directories
    (links.py). A `.tmp-` directory may be unfinished: delete it. A `.replaced-` one is a complete checkpoint moved
    aside for a new save of the same step: delete it if the new one made it into place, else put it back, since it
    is then the only complete copy of that step."""
    for p in folder.glob(f"{REPLACED_PREFIX}step*"):
        final = folder / p.name[len(REPLACED_PREFIX) :]
        if (final / TRAINER_STATE).is_file():
            log.warning("removing %s, replaced by %s in an interrupted save", p, final)
            shutil.rmtree(p, ignore_errors=True)
        else:
            log.warning("restoring %s: a save that was replacing it was interrupted", final)
            if final.exists():
                shutil.rmtree(final)
            os.replace(p, final)
    for p in folder.glob(f"{TMP_PREFIX}*"):
        if p.name.startswith(f"{TMP_PREFIX}step") and p.is_dir() and not p.is_symlink():
            log.warning("removing %s, an incomplete checkpoint of an interrupted save", p)
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_symlink() or p.is_file():  # a link or an atomic write (metrics.jsonl, config.yaml) cut short
            p.unlink(missing_ok=True)
    for p in folder.glob(f"step*{SAVING_SUFFIX}"):
        p.unlink(missing_ok=True)
    links.restore_links(folder)  # `latest` made a directory by a copy (object storage, cp -rL): the link again
