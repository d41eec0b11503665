"""A finished checkpoint read as a file, outside training: its config, its tensors, its tokenizer; and the
checkpoint an import writes.

`unshard`, `export-hf` and `generate` all start from a checkpoint directory that a trainer wrote (sharded
`stepN/` or unsharded `stepN-unsharded/`) or that `import-hf` or `import-olmo` made, and need the same three
things from it. They
run in one plain process: no process group and no knowledge of the world size that saved it, so a checkpoint
written by 64 GPUs is read on a laptop. Sharded tensors are assembled by `torch.distributed.checkpoint` from its
own metadata, reading only the keys asked for (the model without the optimizer, say), so memory stays near one
copy of what is read. Files are checked against the checkpoint's checksums.json before they are read, and
nothing in them is unpickled freely (safety.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from olmo_data.config import ModelConfig, TrainConfig, load_config, save_config
from olmo_data.dataset import read_manifest
from olmo_data.errors import DataError
from olmo_train.checkpoint import safety
from olmo_train.checkpoint.integrity import Recorder
from olmo_train.checkpoint.layout import CONFIG, DCP_METADATA, MODEL_FILE, TMP_PREFIX, TRAINER_STATE, TrainerState
from olmo_train.checkpoint.load import check_files
from olmo_train.checkpoint.space import REFUSALS, refusal

log = logging.getLogger(__name__)


def checkpoint_kind(path: Path) -> str:
    """Either "sharded" or "unsharded"; anything else is refused with what a checkpoint directory should hold."""
    if not path.is_dir():
        raise DataError(f"{path}: no such checkpoint directory")
    safety.check_link(path)
    if not (path / TRAINER_STATE).is_file():
        raise DataError(
            f"{path}: not a complete checkpoint (no {TRAINER_STATE}; an interrupted save leaves a .tmp-stepN "
            "directory without it); give a stepN or stepN-unsharded directory"
        )
    if (path / MODEL_FILE).is_file():
        return "unsharded"
    if (path / DCP_METADATA).is_file():
        return "sharded"
    raise DataError(
        f"{path}: neither {MODEL_FILE} (unsharded) nor {DCP_METADATA} (sharded) is there; the checkpoint is "
        "incomplete or not one of ours"
    )


def config_path(path: Path) -> Path:
    """The config.yaml that describes a checkpoint: its own, else (older checkpoints) its save folder's."""
    for candidate in (path / CONFIG, path.parent / CONFIG):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"{path}: no {CONFIG} in the checkpoint or its save folder {path.parent}; the model's shape is unknown "
        "without it (copy the run's config.yaml into the checkpoint directory)"
    )


def read_config(path: Path) -> TrainConfig:
    """The checkpoint's training config (data paths may be missing: only the model needs to be described)."""
    return load_config(config_path(path), require_data=False)


def read_stored_model(path: Path) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict as the checkpoint stores it, on CPU, keyed as the trained model's
    `state_dict()`: a ReLoRA run's sharded checkpoint holds its adapters unmerged (`convert.read_model_state`
    gives the plain weights of any checkpoint).

    A tied output head appears under both names, sharing one tensor, as `state_dict()` gives it.
    """
    kind = checkpoint_kind(path)
    check_files(path, weights_only=True)  # against checksums.json; a sharded one's metadata read safely
    if kind == "unsharded":
        state = safety.load_file(path / MODEL_FILE, "a model state")
        if not isinstance(state, dict):
            raise DataError(f"{path / MODEL_FILE}: expected a dict of tensors, got {type(state).__name__}")
        return state
    return read_sharded(path, "model")


def read_sharded(path: Path, key: str) -> dict[str, Any]:
    """One top-level entry ("model" or "optim") of a sharded checkpoint, unsharded into plain CPU tensors, in
    this process alone. The caller checks the files first (`check_files`)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        loaded = safety.read_keys(path, {key})
    except DataError:
        raise
    except (Exception, CheckpointException) as e:  # DCP wraps read errors in a BaseException
        raise DataError(
            f"{path}: cannot read the sharded checkpoint's {key!r} state ({_cause(e)}); a shard file may be missing "
            "or truncated"
        ) from e
    if key not in loaded:
        raise DataError(f"{path}: the sharded checkpoint holds no {key!r} state (found: {sorted(loaded)})")
    return loaded[key]  # type: ignore[no-any-return]


def _cause(e: BaseException) -> str:
    """The underlying error of a failed DCP read in one line (DCP's own message is a traceback per rank)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    return f"{type(e).__name__}: {e}"


def recorded_tokenizer(cfg: TrainConfig) -> dict[str, Any] | None:
    """The tokenizer identity ({name, path, sha256, vocab_size, ...}) the run's data manifests record, or None
    when the data has no manifest (or is not reachable from here). Data made with several tokenizers is refused:
    no one tokenizer describes such a model."""
    found: dict[str, dict[str, Any]] = {}
    for data_path in cfg.data.paths:
        directory = data_path if not data_path.endswith(".npy") else (os.path.dirname(data_path) or ".")
        try:
            manifest = read_manifest(directory)
        except DataError:
            continue
        identity = (manifest or {}).get("tokenizer") or {}
        if identity.get("sha256"):
            merged = dict(identity)
            for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
                merged.setdefault(key, (manifest or {}).get(key))
            found.setdefault(str(identity["sha256"]), merged)
    if len(found) > 1:
        names = ", ".join(f"{i.get('name')!r} (sha256 {sha[:16]}...)" for sha, i in found.items())
        raise DataError(f"the run's data was tokenized with several tokenizers ({names}); give --tokenizer")
    return next(iter(found.values()), None)


def refuse_existing(dest: Path) -> None:
    """A conversion never writes over what is there: checked before any work, and again by atomic_directory
    when it renames its result into place."""
    if os.path.lexists(dest):
        raise DataError(f"{dest}: the destination exists; remove it or give another --destination")


@contextlib.contextmanager
def atomic_directory(dest: Path) -> Iterator[Path]:
    """A `.tmp-` sibling to fill; renamed onto `dest` when the block completes, removed when it fails, so a
    converted checkpoint or model never exists half-written under its name."""
    tmp = dest.parent / f"{TMP_PREFIX}{dest.name}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(tmp):
        log.warning("removing %s, left by an interrupted conversion", tmp)
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        if os.path.lexists(dest):  # made by someone else meanwhile: never replace it
            raise DataError(f"{dest}: the destination appeared while converting; remove it or give another one")
        os.rename(tmp, dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        code = None if isinstance(e, DataError) else refusal(e, dest.parent)  # a full disk, a read-only mount...
        if code is not None:
            meaning, remedy = REFUSALS[code]
            raise DataError(
                f"{dest}: {meaning} ({os.strerror(code)}); the partial {tmp.name} was removed: {remedy} and rerun"
            ) from e
        raise


def write_imported(
    dest: Path,
    model: ModelConfig,
    state: dict[str, torch.Tensor],
    add_files: Callable[[Path], None] | None = None,
    lineage: list[dict[str, Any]] | None = None,
    *,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write an imported model as the unsharded checkpoint fine-tuning starts from, and return its path:
    model.pt (fp32, the trainer's master weights), a config.yaml that is a whole training config but for its data
    (load_path set to the checkpoint itself, reset_trainer_state), checksums.json, and trainer_state.json at step 0,
    written last: it marks the checkpoint complete; its `lineage` names the import's source
    (`lineage.import_record`). `add_files` puts anything else (the tokenizer) into the
    directory being filled; `overrides` sets other config fields (an import that brings its optimizer state names
    its optimizer settings and `reset_optimizer_state: false`). All of it under a `.tmp-` name, renamed at the end."""
    state = {k: v.to(torch.float32) for k, v in state.items()}
    if model.weight_tying:
        state["lm_head.weight"] = state["embeddings.weight"]  # one tensor under both names, as state_dict() has it
    cfg = TrainConfig(
        run_name=dest.name,
        save_folder=f"runs/{dest.name}-finetune",
        load_path=str(dest.resolve()),
        reset_trainer_state=True,
        model=model,
        **(overrides or {}),
    )
    with atomic_directory(dest) as tmp:
        log.debug("writing %s", MODEL_FILE)
        written = Recorder(tmp)
        written.torch_save(state, MODEL_FILE)
        save_config(cfg, tmp / CONFIG)
        written.add_file(CONFIG)
        if add_files is not None:
            add_files(tmp)
            for extra in sorted(p.name for p in tmp.iterdir() if p.name not in written.files):
                written.add_file(extra)
        trainer_state = TrainerState(
            step=0, run_name=cfg.run_name, sequence_length=model.max_sequence_length, lineage=list(lineage or [])
        )
        written.finish(TRAINER_STATE, trainer_state.to_bytes())
    return dest
