"""Loading a checkpoint into a model (and optimizer), on any number of ranks, once its files are checked.

Every file is checked against checksums.json before it is read (each rank a share), and nothing of it is
unpickled freely (safety.py): a checkpoint from elsewhere runs no code when loaded. A sharded checkpoint loads
on a different world size (DCP reshards); an unsharded one loads anywhere.

A model that trains more than its plain weights (ReLoRA's adapters) passes `hooks`, its own `LoadHooks`, which
checks that a resume continues the same kind of state and loads weights into or out of adapters; this package
knows nothing of adapters. An unsharded checkpoint's relora.pt (the exact state of what model.pt holds merged)
is taken over model.pt when a run resumes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from olmo_data.config import ModelConfig, load_config
from olmo_data.errors import DataError, shown
from olmo_train.checkpoint import integrity, safety
from olmo_train.checkpoint.layout import (
    CONFIG,
    DCP_METADATA,
    EXACT_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    RNG_DIR,
    TRAINER_STATE,
    TrainerState,
    is_unsharded,
    rng_file,
)
from olmo_train.checkpoint.save import set_rng_state
from olmo_train.distributed import Dist, broadcast_object, raise_together

log = logging.getLogger(__name__)


class LoadHooks:
    """What loading adds for a model with more than plain weights; these defaults are a plain model's."""

    def check_resume(self, path: Path, model: nn.Module) -> None:
        """Refuse to continue a run from a checkpoint whose trained state is of another kind than the model's."""

    def load_weights(self, path: Path, model: nn.Module) -> bool:
        """Load the checkpoint's weights alone where a plain load would not do; True when it did."""
        return False


PLAIN = LoadHooks()


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


def check_files(path: Path, *, weights_only: bool = False, rank: int = 0, world_size: int = 1) -> list[str]:
    """Before anything of a complete checkpoint is read: its files against its checksums.json (each of
    `world_size` ranks a share; the optimizer state left out with `weights_only`), its trainer state's fields,
    and a sharded one's metadata read safely and each shard it names present and long enough. Returns the shard
    names (none if unsharded)."""
    records = integrity.verify(path, skip=[OPTIM_FILE] if weights_only else [], rank=rank, world_size=world_size)
    integrity.read_trainer_state(path)  # its fields by type and value: a copy or an export carries them on
    shards: list[str] = []
    if is_unsharded(path):
        reads = [MODEL_FILE, *([] if weights_only or not (path / OPTIM_FILE).is_file() else [OPTIM_FILE])]
        reads += [EXACT_FILE] if (path / EXACT_FILE).is_file() else []
    else:
        metadata = path / DCP_METADATA
        shards = safety.check_shard_files(metadata, safety.read_metadata(metadata))
        reads = [DCP_METADATA, *shards]
    if records is not None:
        rng = [f"{RNG_DIR}/{p.name}" for p in (path / RNG_DIR).glob("rank*.pt")]
        integrity.require_listed(path, records, [TRAINER_STATE, *reads, *sorted(rng)])
    return shards


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optim: torch.optim.Optimizer | None,
    d: Dist,
    *,
    restore_rng: bool = True,
    hooks: LoadHooks = PLAIN,
    model_config: ModelConfig | None = None,
) -> TrainerState:
    """Load weights (and optimizer state unless `optim` is None) from a sharded or unsharded checkpoint, once its
    files are checked (`check_files`) and its tensors' shapes are the model's (`model_config`, the config's model
    section, lets a refusal name the setting that differs); no file of it is unpickled freely."""
    state = integrity.read_trainer_state(path)
    if is_unsharded(path) and optim is not None and not (path / OPTIM_FILE).is_file():
        # weights only (`unshard --model-only`, a soup, an import); an OLMo-form YAML sets reset_optimizer_state:
        # false, so reset_trainer_state alone still asks for the optimizer state: the advice names both keys
        raise DataError(
            f"{path / OPTIM_FILE}: no optimizer state in this checkpoint (weights only), so neither a resume nor "
            f"a start that keeps the optimizer (reset_optimizer_state: false, restore_dataloader: false) can load "
            f"it; start from its weights alone with --load_path={path} --reset_trainer_state "
            "--reset_optimizer_state=true"
        )
    raise_together(lambda: check_files(path, weights_only=optim is None, rank=d.rank, world_size=d.world_size))
    if optim is not None:
        raise_together(lambda: hooks.check_resume(path, model))
    if optim is None and hooks.load_weights(path, model):
        pass  # weights only, into or out of ReLoRA: merged, adapters afresh
    elif is_unsharded(path):
        opts = StateDictOptions(full_state_dict=True)
        model_sd = safety.load_file(path / MODEL_FILE, "a model state")
        if optim is not None and (path / EXACT_FILE).is_file():  # a resume takes the exact state over the merged
            model_sd = {**model_sd, **safety.load_file(path / EXACT_FILE, "a model state")}
        _refuse_extra_tensors(path, set(model_sd), set(model.state_dict()))
        check_shapes(path, _shapes(model_sd), _shapes(get_model_state_dict(model)), model_config)
        set_model_state_dict(model, model_sd, options=opts)
        if optim is not None:
            optim_sd = safety.load_file(path / OPTIM_FILE, "an optimizer state")
            set_optimizer_state_dict(model, optim, optim_sd, options=opts)
    elif optim is None:
        model_sd = get_model_state_dict(model)
        _refuse_extra_tensors(path, _stored_model_keys(path), set(model_sd))
        raise_together(lambda: check_shapes(path, _stored_shapes(path), _shapes(model_sd), model_config))
        safety.load_sharded(path, {"model": model_sd})
        set_model_state_dict(model, model_sd)
    else:
        model_sd, optim_sd = get_state_dict(model, optim)
        _refuse_extra_tensors(path, _stored_model_keys(path), set(model_sd))
        raise_together(lambda: check_shapes(path, _stored_shapes(path), _shapes(model_sd), model_config))
        safety.load_sharded(path, {"model": model_sd, "optim": optim_sd})
        set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)
    rng_path = path / rng_file(d.rank)
    if restore_rng and rng_path.is_file():  # a rank that did not exist in the saving run keeps its seeded RNG
        rng = _load_rng(rng_path)
        if rng is not None:
            set_rng_state(rng)
    return state


def agree_on_checkpoint(candidate: Path | None) -> Path | None:
    """Rank 0's choice, so that every rank loads the same checkpoint even if they see the filesystem
    differently."""
    chosen = broadcast_object(str(candidate) if candidate else None)
    return Path(chosen) if isinstance(chosen, str) else None


def _stored_model_keys(path: Path) -> set[str]:
    """The model tensors a sharded checkpoint holds, by state-dict key, from its metadata."""
    stored = safety.read_metadata(path / DCP_METADATA).state_dict_metadata
    return {k.removeprefix("model.") for k in stored if k.startswith("model.")}


def _refuse_extra_tensors(path: Path, stored: set[str], wanted: set[str]) -> None:
    """A load reads the tensors the model asks for: a checkpoint holding more (another model's, or a ReLoRA run's
    adapters loaded without its hooks, which would leave the model with unmerged weights) would load in part
    without a word. Refused instead, naming what the model has no place for."""
    extra = sorted(stored - wanted)
    if extra:
        raise DataError(
            f"{path}: holds model tensors this model has no place for ({', '.join(extra[:3])}, ...: {len(extra)} in "
            "all), so it would load in part; it is a checkpoint of another model config (a ReLoRA run's needs its "
            "relora settings; olmo_train.convert.read_model_state gives any checkpoint's plain weights)"
        )


# the model settings that shape its tensors, named first when a checkpoint's differ (the rest in the schema's order)
_SHAPING: tuple[str, ...] = ("d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "vocab_size")
_SHAPING += ("embedding_size", "weight_tying", "attention_layer_norm", "layer_norm_type", "layer_norm_with_affine")


def _shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The full shape of each tensor of a state dict (a DTensor's is the whole tensor's, not this rank's shard)."""
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _stored_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors a sharded checkpoint holds, with their full shapes, from its metadata alone."""
    stored = safety.read_metadata(path / DCP_METADATA).state_dict_metadata
    return {
        k.removeprefix("model."): tuple(v.size)
        for k, v in stored.items()
        if k.startswith("model.") and isinstance(v, TensorStorageMetadata)
    }


def check_shapes(
    path: Path, stored: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]], config: ModelConfig | None
) -> None:
    """Refuse a checkpoint whose tensors are not the model's shape (another model's, copied into a save folder or
    named by load_path) before anything is read into the model: DCP would end in a multi-line traceback of its
    own. The message names the first model setting that differs from the checkpoint's config.yaml (when the
    checkpoint has one and `config` is given), and the first tensor that differs."""
    missing = [k for k in wanted if k not in stored]  # in the model's order: the embedding first
    resized = [k for k in wanted if k in stored and wanted[k] != stored[k]]
    if not missing and not resized:
        return
    if resized:
        name = resized[0]
        tensor = f"tensor {name} is {list(stored[name])} there, {list(wanted[name])} in this model"
    else:
        tensor = f"it has no tensor {missing[0]} ({len(missing)} of this model's are missing)"
    setting = _differing_setting(path, config)
    raise DataError(
        f"{path}: a checkpoint of another model shape: {setting + '; ' if setting else ''}{tensor}. Train with the "
        "model settings it was saved with, or use another save_folder (or load_path)"
    )


def _differing_setting(path: Path, config: ModelConfig | None) -> str | None:
    """'model.KEY is A in CHECKPOINT/config.yaml, B in the config' for the first model setting (those that shape
    tensors first) on which the checkpoint's own config.yaml and `config` differ; None when unknown or equal."""
    recorded = path / CONFIG
    if config is None or not recorded.is_file():
        return None
    try:
        theirs = load_config(recorded, require_data=False, training=False).model
    except DataError:  # an unreadable config.yaml: the tensors alone are named
        return None
    names = [*_SHAPING, *(k for k in vars(config) if k not in _SHAPING)]
    for name in names:
        a, b = getattr(theirs, name, None), getattr(config, name, None)
        if a != b:
            return f"model.{name} is {shown(a)} in {recorded}, {shown(b)} in the config"
    return None
