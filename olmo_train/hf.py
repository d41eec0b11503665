"""Our model in Hugging Face `transformers` terms and back: parameter names, config fields, safetensors files.

Each supported `model_type` is one table of (our name, their name) patterns, `{i}` standing for the layer; export
and import both read the same table, so a name can never be mapped one way and forgotten the other. Every
transformers config field is written explicitly, because their defaults are traps (Olmo2Config's are OLMo-1's:
rope_theta 10000, eps 1e-5, pad 1), and an import refuses any field that would make their model compute something
ours does not (biases, another activation, scaled RoPE) instead of loading it and producing gibberish.

The files themselves are read and written by `hf_files.py`, the conversions of whole checkpoints are
`hf_convert.py` (export_hf, import_hf), the block-by-block comparison `hf_check.py`. None of this needs
`transformers` except the comparison.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from olmo_data.errors import DataError
from olmo_train.config import ModelConfig
from olmo_train.hf_files import CONFIG_JSON, local_model_dir, read_hf_weights, read_json, tokenizer_vocab_size
from olmo_train.model import Transformer, mlp_hidden_size

log = logging.getLogger(__name__)


# (our name, their name); `{i}` is the layer. The tensors every llama-like model type has:
_COMMON: tuple[tuple[str, str], ...] = (
    ("embeddings.weight", "model.embed_tokens.weight"),
    ("blocks.{i}.attention.w_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("blocks.{i}.attention.w_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("blocks.{i}.attention.w_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("blocks.{i}.attention.w_out.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("blocks.{i}.mlp.w_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blocks.{i}.mlp.w_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blocks.{i}.mlp.w_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
)


@dataclass(frozen=True)
class ModelType:
    """One transformers architecture our model can be: which block it is, and its name table.

    A type with fused tensors (OLMo's own `att_proj` = q|k|v) would add a list of (ours..., theirs) splits here;
    the plain renames below stay as they are.
    """

    name: str
    architecture: str
    norm_after: bool
    attention_layer_norm: bool
    names: tuple[tuple[str, str], ...]
    fixed: tuple[tuple[str, Any], ...] = ()  # config fields this type has that must take these values
    ignored: tuple[str, ...] = ()  # their tensors that are derived buffers, skipped on import


MODEL_TYPES: dict[str, ModelType] = {
    # OLMo-2: norm of each sublayer's output (post_attention / post_feedforward), QK-norm over the whole projection
    "olmo2": ModelType(
        name="olmo2",
        architecture="Olmo2ForCausalLM",
        norm_after=True,
        attention_layer_norm=True,
        names=(
            *_COMMON,
            ("blocks.{i}.attention.q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"),
            ("blocks.{i}.attention.k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"),
            ("blocks.{i}.attention_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
            ("blocks.{i}.mlp_norm.weight", "model.layers.{i}.post_feedforward_layernorm.weight"),
        ),
    ),
    # Llama: pre-norm; its `post_attention_layernorm` is the norm *before* the MLP (after attention)
    "llama": ModelType(
        name="llama",
        architecture="LlamaForCausalLM",
        norm_after=False,
        attention_layer_norm=False,
        names=(
            *_COMMON,
            ("blocks.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
            ("blocks.{i}.mlp_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
        ),
        fixed=(("mlp_bias", False),),
        ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq",),  # older llama checkpoints carry the RoPE table
    ),
}


@dataclass(frozen=True)
class ConfigField:
    """A transformers config key and the ModelConfig field it is. `export` computes it where ours is implicit
    (None meaning "the default"); `read` finds it where transformers versions spell it differently."""

    theirs: str
    ours: str
    kind: type
    export: Callable[[ModelConfig], Any] | None = None
    read: Callable[[dict[str, Any]], Any] | None = None


def _rope_theta(hf: dict[str, Any]) -> Any:
    """transformers 5 reads `rope_parameters.rope_theta`, 4.x the top-level `rope_theta`; a config with neither
    runs at transformers' default base, 10000, so that is what the model is."""
    params = hf.get("rope_parameters") or {}
    return params.get("rope_theta", hf.get("rope_theta", 10000.0))


CONFIG_FIELDS: tuple[ConfigField, ...] = (
    ConfigField("vocab_size", "vocab_size", int, export=lambda m: m.embedding_size or m.vocab_size),
    ConfigField("hidden_size", "d_model", int),
    ConfigField("intermediate_size", "mlp_hidden_size", int, export=mlp_hidden_size),
    ConfigField("num_hidden_layers", "n_layers", int),
    ConfigField("num_attention_heads", "n_heads", int),
    ConfigField(
        "num_key_value_heads",
        "n_kv_heads",
        int,
        export=lambda m: m.n_kv_heads or m.n_heads,
        read=lambda hf: hf.get("num_key_value_heads") or hf["num_attention_heads"],
    ),
    ConfigField("max_position_embeddings", "max_sequence_length", int),
    ConfigField("rope_theta", "rope_theta", float, read=_rope_theta),
    ConfigField("rms_norm_eps", "layer_norm_eps", float),
    ConfigField("tie_word_embeddings", "weight_tying", bool, read=lambda hf: hf.get("tie_word_embeddings", False)),
    ConfigField("initializer_range", "init_std", float, read=lambda hf: hf.get("initializer_range", 0.02)),
)
# what our block computes and every exported config states; an import with another value is refused
FIXED_FIELDS: tuple[tuple[str, Any], ...] = (("hidden_act", "silu"), ("attention_bias", False))


def model_type_for(model: ModelConfig) -> ModelType:
    """The transformers type whose block is ours, or a refusal naming the config keys that decide it."""
    for mt in MODEL_TYPES.values():
        if (mt.norm_after, mt.attention_layer_norm) == (model.norm_after, model.attention_layer_norm):
            return mt
    raise DataError(
        f"model.norm_after={str(model.norm_after).lower()} with "
        f"model.attention_layer_norm={str(model.attention_layer_norm).lower()} has no transformers equivalent: "
        "olmo2 is model.norm_after=true with model.attention_layer_norm=true, llama is model.norm_after=false with "
        "model.attention_layer_norm=false"
    )


def hf_config(
    model: ModelConfig,
    *,
    bos_token_id: int | None,
    eos_token_id: int | None,
    pad_token_id: int | None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """config.json for `model`, every field explicit (no transformers default is ever relied on)."""
    mt = model_type_for(model)
    out: dict[str, Any] = {"model_type": mt.name, "architectures": [mt.architecture]}
    for f in CONFIG_FIELDS:
        out[f.theirs] = f.kind(f.export(model) if f.export else getattr(model, f.ours))
    out["head_dim"] = model.d_model // model.n_heads
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": out["rope_theta"]}
    out.update(FIXED_FIELDS)
    out.update(mt.fixed)
    out.update(attention_dropout=0.0, use_cache=True, torch_dtype=dtype, dtype=dtype)
    out.update(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return out


def model_config_from_hf(hf: dict[str, Any], source: str = CONFIG_JSON) -> ModelConfig:
    """Our ModelConfig for a transformers config, refusing anything our model would compute differently."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise DataError(
            f"{source}: model_type {model_type!r} is not supported; import takes {' or '.join(MODEL_TYPES)} "
            "(OLMo-2 and Llama-style decoders)"
        )
    mt = MODEL_TYPES[model_type]
    for key, value in FIXED_FIELDS + mt.fixed:
        if key in hf and hf[key] not in (value, None):
            raise DataError(f"{source}: {key} is {hf[key]!r}; only {value!r} is supported (our block has no other)")
    for key in ("rope_scaling", "rope_parameters"):
        rope = hf.get(key) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise DataError(f"{source}: {key} has rope_type {rope_type!r}; only unscaled RoPE ('default') is supported")
    if float(hf.get("attention_dropout") or 0.0) != 0.0:
        log.warning("%s: attention_dropout %s is dropped: our model has no dropout", source, hf["attention_dropout"])
    values: dict[str, Any] = {}
    for f in CONFIG_FIELDS:
        raw = f.read(hf) if f.read else hf.get(f.theirs)
        if raw is None or isinstance(raw, bool) != (f.kind is bool):
            raise DataError(f"{source}: {f.theirs} is {raw!r}; expected a {f.kind.__name__}")
        values[f.ours] = f.kind(raw)
    heads, kv_heads = values["n_heads"], values["n_kv_heads"]
    head_dim = values["d_model"] // heads
    if values["d_model"] % heads or hf.get("head_dim", head_dim) != head_dim:
        raise DataError(
            f"{source}: head_dim {hf.get('head_dim')} with hidden_size {values['d_model']} and num_attention_heads "
            f"{heads}; only head_dim == hidden_size / num_attention_heads is supported"
        )
    if heads % kv_heads or head_dim % 2:
        raise DataError(
            f"{source}: num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}, and the head "
            f"size {head_dim} even"
        )
    return ModelConfig(**values, norm_after=mt.norm_after, attention_layer_norm=mt.attention_layer_norm)


# ---- tensors ------------------------------------------------------------------------------------------------


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)"))


def _renamer(pairs: tuple[tuple[str, str], ...]) -> Callable[[str], str | None]:
    """From-name -> to-name (None for a name the table does not know), for one direction of a table."""
    compiled = [(_compile(src), dst) for src, dst in pairs]

    def rename(key: str) -> str | None:
        for pattern, dst in compiled:
            m = pattern.fullmatch(key)
            if m:
                return dst.format(i=m.group("i")) if "i" in pattern.groupindex else dst
        return None

    return rename


def expected_shapes(model: ModelConfig) -> dict[str, torch.Size]:
    """Our parameter names and shapes for `model`, from the model itself (built without memory)."""
    with torch.device("meta"):
        return {k: v.shape for k, v in Transformer(model).state_dict().items()}


def _check_state(
    state: dict[str, torch.Tensor], model: ModelConfig, name: Callable[[str], str], source: str
) -> list[str]:
    """Refuse a state that is not exactly the tensors `model` has, naming them as `name` does; return our
    names in the model's own order."""
    expected = expected_shapes(model)
    missing = [name(k) for k in expected if k not in state]
    if missing:
        raise DataError(f"{source}: missing {len(missing)} tensors the config implies, e.g. {missing[:4]}")
    unexpected = sorted(name(k) for k in state if k not in expected)
    if unexpected:  # e.g. layers past num_hidden_layers
        raise DataError(f"{source}: tensors the config does not account for, e.g. {unexpected[:4]}")
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise DataError(
                f"{source}: {name(key)} has shape {list(state[key].shape)}, the config implies {list(shape)}"
            )
    return list(expected)


def to_hf_state(
    state: dict[str, torch.Tensor], model: ModelConfig, source: str = "the model state"
) -> dict[str, torch.Tensor]:
    """Our state dict under transformers' names. A tied output head is left out: transformers ties it to the
    embedding on load, and safetensors cannot hold one tensor under two names."""
    mt = model_type_for(model)
    rename = _renamer(mt.names)
    unknown = [k for k in state if rename(k) is None]
    if unknown:
        raise DataError(f"{source}: tensors that a {mt.name} model has no place for: {unknown[:4]}")
    keys = _check_state(state, model, str, source)
    return {rename(k) or k: state[k] for k in keys if not (model.weight_tying and k == "lm_head.weight")}


def from_hf_state(
    hf_state: dict[str, torch.Tensor], hf_cfg: dict[str, Any], source: str = "the model"
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict for a transformers model. A tied head (absent from the files, or present
    and ignored by transformers) is the embedding tensor itself, under both our names, as `state_dict()` has it.
    `vocab_size` is the config's (the embedding rows): `read_hf_dir` narrows it to the tokenizer's."""
    model = model_config_from_hf(hf_cfg, f"{source}/{CONFIG_JSON}")
    mt = MODEL_TYPES[hf_cfg["model_type"]]
    rename = _renamer(tuple((theirs, ours) for ours, theirs in mt.names))
    back = _renamer(mt.names)
    ignored = [_compile(p) for p in mt.ignored]
    state: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        ours = rename(key)
        if ours is None:
            if any(p.fullmatch(key) for p in ignored):
                continue
            raise DataError(f"{source}: tensor {key} has no place in our {mt.name} model (an unsupported variant?)")
        state[ours] = tensor
    if model.weight_tying and "embeddings.weight" in state:
        state["lm_head.weight"] = state["embeddings.weight"]
    keys = _check_state(state, model, lambda k: back(k) or k, source)
    return model, {k: state[k] for k in keys}


# ---- files --------------------------------------------------------------------------------------------------


def read_hf_dir(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict for a transformers model directory (or hub id).

    `vocab_size` is the directory tokenizer's vocabulary and `embedding_size` the padded row count when it is
    larger (OLMo-2 pads 100278 ids to 100352 rows), so the config says both what the tokenizer produces and what
    the weights hold.
    """
    directory = local_model_dir(path)
    hf_cfg = read_json(directory / CONFIG_JSON, "config")
    rows = model_config_from_hf(hf_cfg, str(directory / CONFIG_JSON)).vocab_size  # refused before reading weights
    vocab = tokenizer_vocab_size(directory)
    if vocab is not None and vocab > rows:
        raise DataError(
            f"{directory / 'tokenizer.json'}: {vocab} tokens, but the model's embedding has {rows} rows "
            f"({CONFIG_JSON} vocab_size); ids past {rows - 1} would have no embedding"
        )
    model, state = from_hf_state(read_hf_weights(directory), hf_cfg, str(directory))
    if vocab is not None and vocab < rows:
        model.embedding_size, model.vocab_size = rows, vocab
    return model, state


def expected_hf_names(model: ModelConfig) -> set[str]:
    """The tensor names an export of `model` writes, from the table (for checking an export without
    transformers)."""
    rename = _renamer(model_type_for(model).names)
    return {rename(k) or k for k in expected_shapes(model) if not (model.weight_tying and k == "lm_head.weight")}
