"""A sharded checkpoint made into an unsharded one, in one plain CPU process.

A sharded checkpoint (`stepN/`) needs `torch.distributed.checkpoint` and its metadata to be read, while an
unsharded one (`model.pt`, `optim.pt`) is two `torch.load`s: what other tools, a laptop, or a run on another
kind of machine expect. DCP's metadata records every tensor's global shape and where each of its pieces lies, so
the pieces are assembled here without a process group and without knowing the world size that saved them.

The result is, file for file, what the trainer's `save_unsharded` writes at that step, so it resumes a run (or,
with `model_only`, seeds a fresh one with `--reset_trainer_state`) exactly as the trainer's own would. Memory
stays near one copy of the largest part: the model is read, written and freed before the optimizer state (about
twice the model's size with AdamW) is read. Nothing appears under the destination's name until it is complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from olmo_data.errors import DataError
from olmo_train.checkpoint import CONFIG, TRAINER_STATE
from olmo_train.checkpoint_files import (
    DCP_METADATA,
    MODEL_FILE,
    OPTIM_FILE,
    atomic_directory,
    checkpoint_kind,
    config_path,
    read_sharded,
)

log = logging.getLogger(__name__)

RNG_FILE = Path("rng") / "rank0.pt"


def unshard(checkpoint: Path, destination: Path | None = None, *, model_only: bool = False) -> Path:
    """Write the unsharded form of the sharded `checkpoint` to `destination` (default: `stepN-unsharded` beside
    it) and return its path. With `model_only` the optimizer state is left out: enough for export, generation
    and fine-tuning, not for continuing the run; its default name is then `stepN-model`, which the trainer does
    not take for a checkpoint to resume from."""
    # `latest` is a link: resolved, the default destination is stepN-unsharded, not the latest-unsharded link
    source = Path(checkpoint).expanduser().resolve()
    if checkpoint_kind(source) == "unsharded":
        raise DataError(f"{checkpoint}: already unsharded (it holds {MODEL_FILE}); use it as it is")
    suffix = "-model" if model_only else "-unsharded"
    dest = Path(destination).expanduser() if destination is not None else source.parent / f"{source.name}{suffix}"
    if os.path.lexists(dest):
        raise DataError(f"{dest}: the destination exists; remove it or give another --destination")
    metadata = _check_shard_files(source)
    config = _config_or_none(source)

    with atomic_directory(dest) as tmp:
        (tmp / RNG_FILE.parent).mkdir()
        _write_part(source, "model", tmp / MODEL_FILE, metadata)
        if not model_only:
            _write_part(source, "optim", tmp / OPTIM_FILE, metadata)
        if (source / RNG_FILE).is_file():
            shutil.copyfile(source / RNG_FILE, tmp / RNG_FILE)
        if config is not None:
            shutil.copyfile(config, tmp / CONFIG)
        shutil.copyfile(source / TRAINER_STATE, tmp / TRAINER_STATE)  # last: it marks the checkpoint complete
    return dest


def _check_shard_files(path: Path) -> Metadata:
    """Refuse a missing or truncated shard before writing anything; a truncated file could otherwise pass
    unnoticed where it only cuts state that is not read (the optimizer's, with `model_only`)."""
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as e:
        raise DataError(
            f"{path / DCP_METADATA}: unreadable ({type(e).__name__}: {e}); the checkpoint is corrupt (copy it again)"
        ) from e
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            raise DataError(f"{path}: shard file {name} is missing; the checkpoint is incomplete (copy it again)")
        if shard.stat().st_size < size:
            raise DataError(
                f"{path}: shard file {name} is truncated ({shard.stat().st_size} bytes, the checkpoint's metadata "
                f"needs {size}); the checkpoint is incomplete (copy it again)"
            )
    return metadata


def _config_or_none(path: Path) -> Path | None:
    """The run's config travels with the checkpoint; its absence does not stop the weights from being useful."""
    try:
        return config_path(path)
    except DataError as e:
        log.warning("%s; the unsharded checkpoint will have no %s", e, CONFIG)
        return None


def _write_part(source: Path, key: str, target: Path, metadata: Metadata) -> None:
    tensors = [
        m
        for k, m in metadata.state_dict_metadata.items()
        if k.startswith(f"{key}.") and isinstance(m, TensorStorageMetadata)
    ]
    size = sum(m.size.numel() * m.properties.dtype.itemsize for m in tensors)
    log.info("reading %s state (%d tensors, %.1f MB)...", key, len(tensors), size / 1e6)
    t0 = time.perf_counter()
    state = read_sharded(source, key)
    log.info("writing %s ...", target.name)
    torch.save(state, target)
    del state  # freed before the next part is read
    log.info("%s done in %.1f s", target.name, time.perf_counter() - t0)
