"""OLMo's own checkpoints (the `allenai/OLMo` trainer's unsharded `stepN-unsharded/`: model.pt + config.yaml) as
models of ours: `olmo-train import-olmo`, and `load_model` on such a directory.

OLMo's layout is one more name table (`OLMO_TENSORS`, read by hf.py's two table functions): its attention input
is one fused `att_proj` (q, k, v rows, in that order) and its MLP input one fused `ff_proj` whose first half is
the "up" projection and second half the gate (its SwiGLU does `x, gate = x.chunk(2); silu(gate) * x`). Its config
keys mostly have our names, with two traps: OLMo's `mlp_hidden_size` (or `mlp_ratio * d_model`) is the fused
width, twice our SwiGLU hidden size; and a key the file leaves out takes OLMo's default, which is GPT-2's
(biases on, RoPE off, LayerNorm), not ours. Options our model does not compute (ALiBi, biases, clipped q/k/v, the
llama block, MoE) are refused by their config key rather than imported as a model that computes something else.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from olmo_data.config import ModelConfig
from olmo_data.config.olmo import MODEL_KEYS, OLMO_DEFAULTS, REQUIRED, model_values_from_olmo
from olmo_data.dataset import is_not_found_error
from olmo_data.display import Stages
from olmo_data.errors import DataError
from olmo_data.io import cached_download, is_remote
from olmo_data.remote import remote_reader
from olmo_train import checkpoint as ckpt
from olmo_train.checkpoint import CONFIG, TRAINER_STATE
from olmo_train.convert.hf_tokenizer import import_tokenizer, write_tokenizer
from olmo_train.convert.tables import ConfigField, Fused, TensorTable, to_our_state, to_their_state
from olmo_train.nn import mlp_hidden_size

log = logging.getLogger(__name__)

MODEL_FILE = "model.pt"

OLMO_TENSORS = TensorTable(
    (
        ("embeddings.weight", "transformer.wte.weight"),
        ("blocks.{i}.attention.w_out.weight", "transformer.blocks.{i}.attn_out.weight"),
        ("blocks.{i}.mlp.w_down.weight", "transformer.blocks.{i}.ff_out.weight"),
        # pre-norm: the norm before each sublayer; norm_after (OLMo-2): the norm of its output, under the same name
        ("blocks.{i}.attention_norm.weight", "transformer.blocks.{i}.attn_norm.weight"),
        ("blocks.{i}.mlp_norm.weight", "transformer.blocks.{i}.ff_norm.weight"),
        ("blocks.{i}.attention.q_norm.weight", "transformer.blocks.{i}.q_norm.weight"),
        ("blocks.{i}.attention.k_norm.weight", "transformer.blocks.{i}.k_norm.weight"),
        ("norm.weight", "transformer.ln_f.weight"),
        ("lm_head.weight", "transformer.ff_out.weight"),  # absent when weight_tying
    ),
    fused=(
        Fused(
            "transformer.blocks.{i}.att_proj.weight",
            ("blocks.{i}.attention.w_q.weight", "blocks.{i}.attention.w_k.weight", "blocks.{i}.attention.w_v.weight"),
        ),
        Fused("transformer.blocks.{i}.ff_proj.weight", ("blocks.{i}.mlp.w_up.weight", "blocks.{i}.mlp.w_gate.weight")),
    ),
)

_EXPORTS: dict[str, Callable[[ModelConfig], Any]] = {  # how OLMo spells the keys whose meaning differs from ours
    "n_kv_heads": lambda m: m.n_kv_heads or m.n_heads,
    "mlp_hidden_size": lambda m: 2 * mlp_hidden_size(m),
    "embedding_size": lambda m: m.embedding_size or m.vocab_size,
    "layer_norm_type": lambda m: "rms" if m.layer_norm_type == "rms" else "default",
}
# OLMo's keys and our fields (olmo_config's table, read by the training config's translation too), both ways
FIELDS: tuple[ConfigField, ...] = tuple(
    ConfigField(theirs, ours, kind, export=_EXPORTS.get(theirs), read=read) for theirs, ours, kind, read in MODEL_KEYS
)


def model_config_from_olmo(section: dict[str, Any], source: str = CONFIG, prefix: str = "model.") -> ModelConfig:
    """Our ModelConfig for the `model:` section of an OLMo config.yaml, refusing by key any option that would make
    OLMo's model compute something ours does not. `prefix` names the keys in messages (hf_olmo's config.json has
    them at its top level)."""
    model = ModelConfig(**model_values_from_olmo(section, source, prefix=prefix))
    if section.get("layer_norm_type") == "low_precision":
        log.info("%s: %slayer_norm_type low_precision is imported as layer_norm (normalised in fp32)", source, prefix)
    _check_shape(model, source, prefix)
    return model


def _check_shape(model: ModelConfig, source: str, p: str) -> None:
    heads, kv_heads = model.n_heads, model.n_kv_heads or model.n_heads
    if model.d_model % heads or (model.d_model // heads) % 2:
        raise DataError(f"{source}: {p}d_model {model.d_model} must be n_heads {heads} heads of an even size")
    if heads % kv_heads:
        raise DataError(f"{source}: {p}n_heads {heads} is not a multiple of the {kv_heads} key/value heads")
    if model.embedding_size is not None and model.embedding_size < model.vocab_size:
        raise DataError(f"{source}: {p}embedding_size {model.embedding_size} < {p}vocab_size {model.vocab_size}")


def olmo_model_section(model: ModelConfig) -> dict[str, Any]:
    """The `model:` section of an OLMo config.yaml for our model (every key this import reads, explicit)."""
    out = dict(OLMO_DEFAULTS)
    out.update({key: allowed[0] for key, allowed, _ in REQUIRED})
    for f in FIELDS:
        out[f.theirs] = f.export(model) if f.export else getattr(model, f.ours)
    return out


# ---- files --------------------------------------------------------------------------------------------------


def _fetch(spec: str, name: str) -> Path:
    """`name` of the checkpoint at `spec`: the file itself when local, else a download into the cache (through
    `olmo_data.remote`: a stalled server fails after its timeout, naming the URL, instead of hanging)."""
    if not is_remote(spec):
        return Path(spec).expanduser() / name
    return cached_download(f"{spec.rstrip('/')}/{name}")


def _exists(spec: str, name: str) -> bool:
    """Whether the checkpoint at `spec` has `name`; remote, only "not found" is an absence (one HEAD request): a
    server that fails or stalls is an error naming the URL, not a reason to read the checkpoint as another kind."""
    if not is_remote(spec):
        return (Path(spec).expanduser() / name).is_file()
    try:
        remote_reader().size(f"{spec.rstrip('/')}/{name}")
        return True
    except DataError as e:
        if is_not_found_error(e):
            return False
        raise


def is_olmo_checkpoint(spec: str) -> bool:
    """An OLMo trainer's unsharded checkpoint: config.yaml and model.pt, without the trainer_state.json every
    checkpoint of ours has (remote: asked of the server, the small files only)."""
    if is_remote(spec):
        return not _exists(spec, TRAINER_STATE) and _exists(spec, CONFIG)
    return _exists(spec, CONFIG) and _exists(spec, MODEL_FILE) and not _exists(spec, TRAINER_STATE)


def read_olmo_config(spec: str) -> tuple[ModelConfig, dict[str, Any]]:
    """Our ModelConfig for an OLMo checkpoint, and its whole config.yaml (the tokenizer, special ids)."""
    path = _fetch(spec, CONFIG)
    where = f"{spec.rstrip('/')}/{CONFIG}"
    if not is_remote(spec):
        directory = Path(spec).expanduser()
        if not directory.is_dir():
            raise DataError(f"{spec}: no such checkpoint directory")
        if (directory / TRAINER_STATE).exists():
            raise DataError(
                f"{spec}: a checkpoint of this project ({TRAINER_STATE}), not OLMo's; use it as it is (--load_path, "
                "generate, export-hf)"
            )
        if not path.is_file():
            raise DataError(f"{spec}: no {CONFIG}; OLMo's checkpoint directories hold their run's config there")
    try:
        config = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not valid YAML ({e})") from e
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise DataError(f"{where}: no `model:` section; not the config.yaml of an OLMo checkpoint")
    return model_config_from_olmo(config["model"], where), config


def read_olmo_checkpoint(spec: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Our ModelConfig and state dict for OLMo's unsharded checkpoint at `spec` (a directory or URL), and its
    config.yaml. The config is read and checked before the weights are fetched."""
    model, config = read_olmo_config(spec)
    return model, read_olmo_weights(spec, model, config), config


def read_olmo_weights(spec: str, model: ModelConfig, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model.pt of OLMo's checkpoint at `spec` under our names, checked against `model`."""
    if not _exists(spec, MODEL_FILE):
        raise DataError(
            f"{spec}: no {MODEL_FILE}; only OLMo's unsharded checkpoints (stepN-unsharded) are read: unshard a "
            "sharded one with OLMo's scripts/unshard.py first"
        )
    weights = _fetch(spec, MODEL_FILE)
    where = f"{spec.rstrip('/')}/{MODEL_FILE}"
    log.debug("reading %s", where)
    try:  # weights_only: plain tensors, nothing else unpickled; mmap: read as the tensors are used
        olmo_state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise DataError(f"{where}: cannot be read as a state dict of tensors ({type(e).__name__}: {e})") from e
    if not isinstance(olmo_state, dict) or not all(isinstance(v, torch.Tensor) for v in olmo_state.values()):
        raise DataError(f"{where}: expected a dict of tensors (an OLMo model state dict)")
    group = config["model"].get("block_group_size") or 1
    olmo_state = {plain_olmo_name(k, group): v for k, v in olmo_state.items()}
    return to_our_state(OLMO_TENSORS, olmo_state, model, "OLMo", where)


_BLOCK_GROUP = re.compile(r"transformer\.block_groups\.(\d+)\.(\d+)\.")


def plain_olmo_name(key: str, group_size: int) -> str:
    """OLMo's own loader accepts two other spellings of its names: an FSDP wrapper's prefix, and blocks grouped by
    `block_group_size` (`block_groups.G.J` is block G * size + J)."""
    key = key.replace("_fsdp_wrapped_module.", "")
    m = _BLOCK_GROUP.match(key)
    if m:
        key = f"transformer.blocks.{int(m[1]) * group_size + int(m[2])}.{key[m.end() :]}"
    return key


def to_olmo_state(state: dict[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict under OLMo's names, fused tensors concatenated (the tied head left out, as OLMo has it)."""
    return to_their_state(OLMO_TENSORS, state, model, "OLMo", "the model state")


def import_olmo(checkpoint: str, destination: Path, *, tokenizer: str | None = None) -> Path:
    """Make an unsharded checkpoint of ours (model.pt, config.yaml, trainer_state.json, and the tokenizer when one
    is given) from OLMo's unsharded checkpoint directory or URL; return its path.

    OLMo's checkpoints carry no tokenizer (their config names one, `tokenizer.identifier`); `tokenizer` is that
    tokenizer.json, shipped with the eos and pad ids OLMo's config states, so that `generate` and `export-hf`
    work on the result."""

    dest = Path(destination).expanduser()
    ckpt.refuse_existing(dest)
    t0 = time.perf_counter()
    model, config = read_olmo_config(checkpoint)  # refused before the (large) weights are fetched
    named = (config.get("tokenizer") or {}).get("identifier")
    tok = import_tokenizer(tokenizer, model, checkpoint, "OLMo's", named)

    def add_tokenizer(tmp: Path) -> None:
        if tok is not None:  # with the special ids OLMo's config states (OLMo uses no BOS)
            special = {"bos": None, **{s: config["model"].get(f"{s}_token_id") for s in ("eos", "pad")}}
            ids = {s: i if isinstance(i, int) and 0 <= i < tok.vocab_size else None for s, i in special.items()}
            write_tokenizer(tok, ids, model, tmp)

    with Stages("import-olmo", ["reading", "writing"], delay=1.0) as stages:  # a 7B model: minutes of each
        stages.start("reading")
        state = read_olmo_weights(checkpoint, model, config)
        stages.start("writing")
        record = ckpt.lineage.import_record("import-olmo", checkpoint)
        ckpt.write_imported(dest, model, state, add_tokenizer, [record])
    log.debug("imported %s to %s in %.1f s", checkpoint, dest, time.perf_counter() - t0)
    return dest
