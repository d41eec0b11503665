"""OLMo-core's checkpoints (the trainer of OLMo 2 and later, `ai2-olmo-core`) as checkpoints of ours:
`olmo-train import-olmo-core`, and `load_model` on such a directory.

OLMo-core's Checkpointer writes a step folder `stepN/` holding `model_and_optim/` (a torch.distributed.checkpoint:
`.metadata` and `__R_K.distcp` shards, the model under `model.` and, when the run had one, the optimizer under
`optim.`, flattened per parameter by its train module or nested by `save_model_and_optim_state`), `train/rankR.pt`
(the trainer's counters and RNG states, one file per rank), `.metadata.json` (its version) and, from its
ConfigSaverCallback, the run's `config.json`. Its parameter names are ours but for the MLP (`feed_forward.w1` is
the gate, `w3` the up projection, `w2` the down one), the MLP's norm and the output head's norm (`lm_head.norm`).
The config's translation, and what it refuses, is olmo_core_config.py.

Nothing is unpickled freely: the DCP metadata by the restricted unpickler (OLMo-core's own `_StorageInfo` is one
of the classes it may build), the tensors and the optimizer's hyperparameters with `weights_only`, the trainer
state as plain data and numpy's RNG arrays only. OLMo-core's library is not needed (nor imported) to read them.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from olmo_data.config import ModelConfig, OptimizerConfig
from olmo_data.display import Stages
from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote
from olmo_data.olmo_core import read_config_json
from olmo_train import checkpoint as ckpt
from olmo_train.checkpoint import DCP_METADATA, OPTIM_FILE, TRAINER_STATE, safety
from olmo_train.convert.hf_tokenizer import import_tokenizer, write_tokenizer
from olmo_train.convert.olmo_core_config import max_grad_norm, model_config_from_olmo_core, optimizer_from_olmo_core
from olmo_train.convert.tables import TensorTable, expected_shapes, renamer, to_our_state

log = logging.getLogger(__name__)

MODEL_AND_OPTIM = "model_and_optim"  # OLMo-core's names in its step folder
CONFIG_JSON = "config.json"
TRAIN_STATE = "train/rank0.pt"
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")

OLMO_CORE_TENSORS = TensorTable(
    (
        ("embeddings.weight", "embeddings.weight"),
        ("blocks.{i}.attention.w_q.weight", "blocks.{i}.attention.w_q.weight"),
        ("blocks.{i}.attention.w_k.weight", "blocks.{i}.attention.w_k.weight"),
        ("blocks.{i}.attention.w_v.weight", "blocks.{i}.attention.w_v.weight"),
        ("blocks.{i}.attention.w_out.weight", "blocks.{i}.attention.w_out.weight"),
        ("blocks.{i}.attention.q_norm.weight", "blocks.{i}.attention.q_norm.weight"),
        ("blocks.{i}.attention.k_norm.weight", "blocks.{i}.attention.k_norm.weight"),
        # reordered_norm: the norm of the sublayer's output, under the same name as the pre-norm block's input norm
        ("blocks.{i}.attention_norm.weight", "blocks.{i}.attention_norm.weight"),
        ("blocks.{i}.mlp.w_gate.weight", "blocks.{i}.feed_forward.w1.weight"),  # w2(silu(w1 x) * w3 x)
        ("blocks.{i}.mlp.w_up.weight", "blocks.{i}.feed_forward.w3.weight"),
        ("blocks.{i}.mlp.w_down.weight", "blocks.{i}.feed_forward.w2.weight"),
        ("blocks.{i}.mlp_norm.weight", "blocks.{i}.feed_forward_norm.weight"),
        ("norm.weight", "lm_head.norm.weight"),
        ("lm_head.weight", "lm_head.w_out.weight"),
    )
)


# ---- the folder ---------------------------------------------------------------------------------------------


def _dcp_dir(path: Path) -> Path | None:
    """The distributed checkpoint of an OLMo-core checkpoint at `path`: its step folder's model_and_optim/, or a
    DCP folder given directly (as OLMo-core's own loader also accepts)."""
    if (path / MODEL_AND_OPTIM / DCP_METADATA).is_file():
        return path / MODEL_AND_OPTIM
    if (path / DCP_METADATA).is_file() and path.name == MODEL_AND_OPTIM:
        return path
    return None


def is_olmo_core_checkpoint(spec: str) -> bool:
    """An OLMo-core step folder (or its model_and_optim/), not one of ours (which has trainer_state.json)."""
    if is_remote(spec):
        return False
    path = Path(spec).expanduser()
    return _dcp_dir(path) is not None and not (path / TRAINER_STATE).exists()


def _locate(spec: str, config: str | None) -> tuple[Path, Path, Path]:
    """(step folder, its DCP folder, its config.json), each checked to be there."""
    if is_remote(spec):
        raise DataError(
            f"{spec}: OLMo-core checkpoints are read from a local directory; copy the step folder here first "
            "(e.g. `gsutil -m cp -r` or `aws s3 sync`)"
        )
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise DataError(f"{spec}: no such checkpoint directory")
    if (path / TRAINER_STATE).exists():
        raise DataError(f"{spec}: a checkpoint of this project ({TRAINER_STATE}), not OLMo-core's; use it as it is")
    dcp = _dcp_dir(path)
    if dcp is None:
        raise DataError(
            f"{spec}: no {MODEL_AND_OPTIM}/{DCP_METADATA}; give an OLMo-core step folder (stepN, as its Checkpointer "
            f"writes it) or its {MODEL_AND_OPTIM} directory"
        )
    step_dir = dcp.parent  # config.json and train/ lie beside model_and_optim/
    if config is not None:
        config_file = Path(config).expanduser()
        if not config_file.is_file():
            raise DataError(f"{config}: no such file (the run's config.json)")
    else:
        config_file = step_dir / CONFIG_JSON
        if not config_file.is_file():
            raise DataError(
                f"{step_dir}: no {CONFIG_JSON}; OLMo-core's ConfigSaverCallback writes the run's config there: copy "
                "the run's config.json into the folder, or give it with --config"
            )
    return step_dir, dcp, config_file


def read_olmo_core_config(spec: str, config: str | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Our ModelConfig for the OLMo-core checkpoint at `spec`, and its whole config.json."""
    _, _, config_file = _locate(spec, config)
    raw = read_config_json(str(config_file))
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise DataError(f"{config_file}: no `model` section; not the config.json of an OLMo-core run")
    return model_config_from_olmo_core(raw, str(config_file)), raw


def _stored(dcp: Path) -> set[str]:
    """The top-level entries (model, optim) the DCP folder holds, checked and read from its metadata safely."""
    return {key.split(".", 1)[0] for key in _stored_shapes(dcp)}


def _stored_shapes(dcp: Path) -> dict[str, list[int]]:
    """Every tensor the DCP folder holds (`model.…`, `optim.…`) and its shape, from its metadata read safely."""
    metadata = safety.read_metadata(dcp / DCP_METADATA)
    safety.check_shard_files(dcp / DCP_METADATA, metadata)
    return {k: list(getattr(m, "size", []) or []) for k, m in metadata.state_dict_metadata.items()}


def check_model_shape(dcp: Path, model: ModelConfig, source: str) -> None:
    """The config's layer count, width and vocabulary against the checkpoint's own tensors, from its metadata,
    before any model is built: `n_layers: 100000` or a `d_model` of 2**40 would otherwise build a model (on the
    meta device: minutes, or an overflow) only to find the tensors do not fit it."""
    shapes = _stored_shapes(dcp)
    blocks = {int(m[1]) for k in shapes if (m := re.match(r"model\.blocks\.(\d+)\.", k))}
    layers = max(blocks) + 1 if blocks else 0
    if model.n_layers != layers:
        raise DataError(f"{source}: model.n_layers is {model.n_layers}, but {dcp} holds {layers} blocks")
    embedding = shapes.get("model.embeddings.weight")
    if embedding is None or len(embedding) != 2:
        raise DataError(f"{dcp}: holds no model.embeddings.weight of two dimensions; not an OLMo-core model")
    rows = model.embedding_size or model.vocab_size
    if embedding != [rows, model.d_model]:
        raise DataError(
            f"{source}: model.vocab_size {rows} and d_model {model.d_model}, but {dcp} holds embeddings of shape "
            f"{embedding}"
        )


def _read(dcp: Path, key: str) -> dict[str, Any]:
    return ckpt.read_sharded(dcp, key)


# ---- the model -----------------------------------------------------------------------------------------------


def read_olmo_core_weights(dcp: Path, model: ModelConfig, source: str = "") -> dict[str, torch.Tensor]:
    """The model of OLMo-core's DCP folder under our names, checked against `model` (from the config.json
    `source`): its shape against the checkpoint's metadata before anything is built or read, in fp32."""
    stored = _stored(dcp)
    if "model" not in stored:
        raise DataError(f"{dcp}: holds no model state (found {sorted(stored)}); not an OLMo-core checkpoint")
    check_model_shape(dcp, model, source or str(dcp))
    theirs = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in _read(dcp, "model").items()}
    if model.weight_tying:  # a tied head is the embedding (whether or not the checkpoint lists it twice)
        theirs.pop("lm_head.w_out.weight", None)
    return to_our_state(OLMO_CORE_TENSORS, theirs, model, "OLMo-core", str(dcp))


def read_olmo_core_checkpoint(
    spec: str, config: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Our ModelConfig and state dict for the OLMo-core checkpoint at `spec`, and its config.json (the config is
    read and checked before any tensor)."""
    model, raw = read_olmo_core_config(spec, config)
    _, dcp, cfg_file = _locate(spec, config)
    return model, read_olmo_core_weights(dcp, model, str(cfg_file)), raw


# ---- the optimizer -------------------------------------------------------------------------------------------


def _adam_states(optim: dict[str, Any], names: set[str], dcp: Path) -> dict[str, dict[str, torch.Tensor]]:
    """{their parameter name: {step, exp_avg, exp_avg_sq}} from either spelling OLMo-core saves: nested
    ({"state": {name: {...}}}, `save_model_and_optim_state`'s default) or flattened per parameter
    ("state.NAME.exp_avg", its train module's)."""
    if isinstance(optim.get("state"), dict):
        nested = optim["state"]
    else:
        nested = {}
        for key, value in optim.items():
            if not key.startswith("state."):
                continue
            name, _, field = key.removeprefix("state.").rpartition(".")
            nested.setdefault(name, {})[field] = value
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, state in nested.items():
        if name not in names:
            raise DataError(f"{dcp}: optimizer state for {name}, which is not one of the model's parameters")
        if not isinstance(state, dict) or sorted(state) != sorted(ADAM_STATE):
            found = sorted(state) if isinstance(state, dict) else shown(state)
            raise DataError(
                f"{dcp}: optimizer state of {name} holds {found}, not AdamW's {list(ADAM_STATE)}; import it with "
                "--weights-only"
            )
        out[name] = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in state.items()}
    return out


def optimizer_state(dcp: Path, model: ModelConfig, optim_cfg: OptimizerConfig) -> dict[str, Any] | None:
    """OLMo-core's AdamW state as our optim.pt (the full optimizer state dict torch's `get_optimizer_state_dict`
    gives for our model and optimizer: moments and step per parameter name, and our two parameter groups), or
    None when the checkpoint holds none. Parameters OLMo-core never stepped (no state) start afresh here too."""
    if "optim" not in _stored(dcp):
        return None
    shapes = expected_shapes(model)
    our_name = renamer(tuple((t, o) for o, t in OLMO_CORE_TENSORS.renames))
    params = [k for k in shapes if not (model.weight_tying and k == "lm_head.weight")]
    theirs = {n for n in (their_name(k) for k in params) if n is not None}
    states = _adam_states(_read(dcp, "optim"), theirs, dcp)
    state: dict[str, dict[str, torch.Tensor]] = {}
    for name, entry in states.items():
        ours = our_name(name)
        assert ours is not None
        for key in ("exp_avg", "exp_avg_sq"):
            if entry[key].shape != shapes[ours]:
                raise DataError(
                    f"{dcp}: optimizer state {name}.{key} has shape {list(entry[key].shape)}, the parameter "
                    f"{list(shapes[ours])}"
                )
        state[ours] = {
            "step": entry["step"].reshape(()),
            "exp_avg": entry["exp_avg"],
            "exp_avg_sq": entry["exp_avg_sq"],
        }
    decay: list[str] = []
    no_decay: list[str] = []
    for name in params:  # as olmo_train.train.optim groups them
        is_embedding = name == "embeddings.weight"
        is_norm = len(shapes[name]) < 2
        skip = (is_embedding and not optim_cfg.decay_embeddings) or (is_norm and not optim_cfg.decay_norm_and_bias)
        (no_decay if skip else decay).append(name)
    hyper = {"lr": optim_cfg.learning_rate, "betas": tuple(optim_cfg.betas), "eps": optim_cfg.eps}
    hyper |= {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False}
    hyper |= {"foreach": True, "fused": False, "decoupled_weight_decay": True}
    groups = [
        {**hyper, "weight_decay": optim_cfg.weight_decay, "params": decay},
        {**hyper, "weight_decay": 0.0, "params": no_decay},
    ]
    return {"state": state, "param_groups": [g for g in groups if g["params"]]}


def their_name(ours: str) -> str | None:
    """OLMo-core's name of one of our parameters."""
    return _THEIR_NAME(ours)


_THEIR_NAME = renamer(OLMO_CORE_TENSORS.renames)


def tokenizer_section(config: dict[str, Any]) -> dict[str, Any]:
    """The run's `dataset.tokenizer` (OLMo-core's TokenizerConfig: identifier, vocab_size, special ids), or {}."""
    dataset = config.get("dataset")
    section = dataset.get("tokenizer") if isinstance(dataset, dict) else None
    return section if isinstance(section, dict) else {}


# ---- the trainer state ---------------------------------------------------------------------------------------


def read_train_state(step_dir: Path) -> tuple[int, int]:
    """(global step, tokens trained) of the checkpoint, from OLMo-core's train/rank0.pt read as plain data (numpy's
    RNG state arrays allowed, nothing else), else the step of the folder's name and no token count."""
    fallback = int(m[1]) if (m := re.fullmatch(r"step(\d+)", step_dir.name)) else 0
    path = step_dir / TRAIN_STATE
    if not path.is_file():
        return fallback, 0
    array: list[Any] = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(array):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        log.warning(
            "%s: not readable as plain data (%s); the step is taken from the folder name", path, type(e).__name__
        )
        return fallback, 0
    if not isinstance(state, dict):
        return fallback, 0
    step, tokens = state.get("global_step"), state.get("global_train_tokens_seen")
    if isinstance(step, int) and isinstance(tokens, int) and min(step, tokens) >= 0:
        return step, tokens
    return fallback, 0


# ---- import-olmo-core ----------------------------------------------------------------------------------------


def import_olmo_core(
    checkpoint: str,
    destination: Path,
    *,
    tokenizer: str | None = None,
    config: str | None = None,
    weights_only: bool = False,
) -> Path:
    """Make an unsharded checkpoint of ours (model.pt, optim.pt when OLMo-core's holds AdamW state and not
    `weights_only`, config.yaml, trainer_state.json, and tokenizer.json when `tokenizer` is given) from OLMo-core's
    step folder; return its path. Its config starts a new run from it (load_path, reset_trainer_state) that keeps
    the imported optimizer state when there is one; its lineage names the source and the step and tokens
    OLMo-core had trained."""
    dest = Path(destination).expanduser()
    ckpt.refuse_existing(dest)
    t0 = time.perf_counter()
    model, raw = read_olmo_core_config(checkpoint, config)  # refused before any tensor is read
    step_dir, dcp, config_file = _locate(checkpoint, config)
    check_model_shape(dcp, model, str(config_file))  # before anything is said, built or read
    optim_cfg = None if weights_only or "optim" not in _stored(dcp) else optimizer_from_olmo_core(raw, str(config_file))
    tok = import_tokenizer(tokenizer, model, checkpoint, "OLMo-core's", tokenizer_section(raw).get("identifier"))
    names = ["reading weights", *(["reading optimizer"] if optim_cfg is not None else []), "writing"]
    with Stages("import-olmo-core", names, delay=1.0) as stages:  # a 7B model and its AdamW state: minutes
        stages.start("reading weights")
        state = read_olmo_core_weights(dcp, model, str(config_file))
        if optim_cfg is not None:
            stages.start("reading optimizer")
        optim_sd = optimizer_state(dcp, model, optim_cfg) if optim_cfg is not None else None

        def add_files(tmp: Path) -> None:
            if optim_sd is not None:
                torch.save(optim_sd, tmp / OPTIM_FILE)
            if tok is not None:
                section = tokenizer_section(raw)
                special = {s: section.get(f"{s}_token_id") for s in ("bos", "eos", "pad")}
                ids = {s: i if isinstance(i, int) and 0 <= i < tok.vocab_size else None for s, i in special.items()}
                write_tokenizer(tok, ids, model, tmp)

        step, tokens = read_train_state(step_dir)
        record = ckpt.lineage.import_record("import-olmo-core", checkpoint)
        run_name = raw.get("run_name")
        record.update(step=step, tokens_seen=tokens, run_name=run_name if isinstance(run_name, str) else "")
        overrides: dict[str, Any] = {}
        if optim_sd is not None and optim_cfg is not None:
            overrides = {"optimizer": optim_cfg, "reset_optimizer_state": False, "max_grad_norm": max_grad_norm(raw)}
        stages.start("writing")
        ckpt.write_imported(dest, model, state, add_files, [record], overrides=overrides)
    kept = "weights and AdamW state" if optim_sd is not None else "weights"
    log.info("imported %s (%s, step %d) to %s in %.1f s", checkpoint, kept, step, dest, time.perf_counter() - t0)
    return dest
