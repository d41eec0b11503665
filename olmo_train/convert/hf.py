"""Our model in Hugging Face `transformers` terms and back: parameter names, config fields, safetensors files.

Each supported `model_type` is one table (tables.py) of (our name, their name) patterns; export and import both
read the same table, so a name can never be mapped one way and forgotten the other. Every transformers config
field is written explicitly, because their defaults are traps (Olmo2Config's are OLMo-1's: rope_theta 10000,
eps 1e-5, pad 1), and an import refuses any field that would make their model compute something ours does not
(biases, another activation, scaled RoPE, clipped q/k/v) instead of loading it and producing gibberish.

The files themselves are read and written by `hf_files.py`, the conversions of whole checkpoints are
`hf_convert.py` (export_hf, import_hf), the block-by-block comparison `hf_check.py`. None of this needs
`transformers` except the comparison.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from olmo_data.config import ModelConfig
from olmo_data.errors import DataError, shown
from olmo_train.convert.hf_files import CONFIG_JSON, local_model_dir, read_hf_weights, read_json, tokenizer_vocab_size
from olmo_train.convert.hf_olmo import is_hf_olmo, read_hf_olmo
from olmo_train.convert.hf_olmo3 import needs_olmo3, olmo3_fields, read_olmo3
from olmo_train.convert.tables import ConfigField, TensorTable, expected_shapes, renamer, to_our_state, to_their_state
from olmo_train.nn import mlp_hidden_size

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
    ("lm_head.weight", "lm_head.weight"),
)
_FINAL_NORM = ("norm.weight", "model.norm.weight")


@dataclass(frozen=True)
class Block:
    """What a block computes, in our config's keys: the four choices that decide which architecture it is."""

    layer_norm_type: str
    layer_norm_with_affine: bool
    norm_after: bool
    attention_layer_norm: bool

    @classmethod
    def of(cls, model: ModelConfig) -> Block:
        return cls(*(getattr(model, f.name) for f in dataclasses.fields(cls)))

    def describe(self) -> str:
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return ", ".join(f"model.{k}={str(v).lower()}" for k, v in values)


@dataclass(frozen=True)
class ModelType:
    """One transformers architecture our model can be: which block it is, and its name table."""

    name: str
    architecture: str
    block: Block
    tensors: TensorTable
    fixed: tuple[tuple[str, Any], ...] = ()  # config fields this type has that must take these values
    # the config key of the norms' epsilon, or the value their code fixes (OlmoLayerNorm: 1e-5, no config key)
    norm_eps: str | float = "rms_norm_eps"
    windows: bool = False  # layer types, a sliding window and RoPE per layer type (hf_olmo3)


_OLMO2_BLOCK = Block("rms", layer_norm_with_affine=True, norm_after=True, attention_layer_norm=True)
_OLMO2_TENSORS = TensorTable(
    (
        *_COMMON,
        _FINAL_NORM,
        ("blocks.{i}.attention.q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"),
        ("blocks.{i}.attention.k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"),
        ("blocks.{i}.attention_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
        ("blocks.{i}.mlp_norm.weight", "model.layers.{i}.post_feedforward_layernorm.weight"),
    )
)
MODEL_TYPES: dict[str, ModelType] = {
    # OLMo-2: norm of each sublayer's output (post_attention / post_feedforward), QK-norm over the whole projection
    "olmo2": ModelType(name="olmo2", architecture="Olmo2ForCausalLM", block=_OLMO2_BLOCK, tensors=_OLMO2_TENSORS),
    # OLMo 3: OLMo-2's block and tensors, with attention windows on the sliding layers and YaRN on the others
    "olmo3": ModelType("olmo3", "Olmo3ForCausalLM", _OLMO2_BLOCK, _OLMO2_TENSORS, windows=True),
    # Llama: pre-norm; its `post_attention_layernorm` is the norm *before* the MLP (after attention)
    "llama": ModelType(
        name="llama",
        architecture="LlamaForCausalLM",
        block=Block("rms", layer_norm_with_affine=True, norm_after=False, attention_layer_norm=False),
        tensors=TensorTable(
            (
                *_COMMON,
                _FINAL_NORM,
                ("blocks.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
                ("blocks.{i}.mlp_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
            ),
            ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq",),  # older llama checkpoints carry the table
        ),
        fixed=(("mlp_bias", False),),
    ),
    # OLMo-1: pre-norm with LayerNorms that have no weights at all (so no norm tensors), no QK-norm
    "olmo": ModelType(
        name="olmo",
        architecture="OlmoForCausalLM",
        block=Block("layer_norm", layer_norm_with_affine=False, norm_after=False, attention_layer_norm=False),
        tensors=TensorTable(_COMMON),
        fixed=(("clip_qkv", None),),  # OLMo-7B-0424/0724 clip q, k and v at 8; our attention does not clip
        norm_eps=1e-5,
    ),
}


def _rope_theta(hf: dict[str, Any]) -> Any:
    """transformers 5 reads `rope_parameters.rope_theta`, 4.x the top-level `rope_theta`; a config with neither
    runs at transformers' default base, 10000, so that is what the model is."""
    params = hf.get("rope_parameters") or {}
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):  # olmo3: per layer type
        params = params["full_attention"]
    default = 500_000.0 if hf.get("model_type") == "olmo3" else 10000.0  # Olmo3Config's default_theta
    return params.get("rope_theta", hf.get("rope_theta", default))


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
        # absent (None) means as many as the attention heads; a 0 is not "absent" but broken, refused below
        read=lambda hf: (
            hf["num_attention_heads"] if hf.get("num_key_value_heads") is None else hf["num_key_value_heads"]
        ),
    ),
    ConfigField("max_position_embeddings", "max_sequence_length", int),
    ConfigField("rope_theta", "rope_theta", float, read=_rope_theta),
    ConfigField("tie_word_embeddings", "weight_tying", bool, read=lambda hf: hf.get("tie_word_embeddings", False)),
    ConfigField("initializer_range", "init_std", float, read=lambda hf: hf.get("initializer_range", 0.02)),
)
# what our block computes and every exported config states; an import with another value is refused
FIXED_FIELDS: tuple[tuple[str, Any], ...] = (("hidden_act", "silu"), ("attention_bias", False))


def model_type_for(model: ModelConfig) -> ModelType:
    """The transformers type whose block is ours, or a refusal naming the config keys that decide it."""
    block, windows = Block.of(model), needs_olmo3(model)
    for mt in MODEL_TYPES.values():
        if mt.block != block or mt.windows != windows:
            continue
        if isinstance(mt.norm_eps, float) and model.layer_norm_eps != mt.norm_eps:
            raise DataError(
                f"model.layer_norm_eps={model.layer_norm_eps:g} has no transformers equivalent: {mt.name}'s norms "
                f"have their epsilon fixed at {mt.norm_eps:g}"
            )
        return mt
    if windows:
        raise DataError(
            f"attention windows or RoPE scaling with {block.describe()}: transformers has them as olmo3, which is "
            f"OLMo-2's block ({_OLMO2_BLOCK.describe()})"
        )
    types = "; ".join(f"{mt.name} is {mt.block.describe()}" for mt in MODEL_TYPES.values() if not mt.windows)
    raise DataError(f"{block.describe()} has no transformers equivalent: {types}")


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
    if isinstance(mt.norm_eps, str):
        out[mt.norm_eps] = float(model.layer_norm_eps)
    out["head_dim"] = model.d_model // model.n_heads
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": out["rope_theta"]}
    if mt.windows:
        out.update(olmo3_fields(model))
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
            f"{source}: model_type {model_type!r} is not supported; import takes {', '.join(MODEL_TYPES)} "
            "(OLMo-2, OLMo 3, Llama-style and OLMo-1 decoders)"
        )
    mt = MODEL_TYPES[model_type]
    for key, value in FIXED_FIELDS + mt.fixed:
        if key in hf and hf[key] not in (value, None):
            raise DataError(f"{source}: {key} is {hf[key]!r}; only {value!r} is supported (our block has no other)")
    for key in () if mt.windows else ("rope_scaling", "rope_parameters"):  # olmo3's: read_olmo3
        rope = hf.get(key) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise DataError(f"{source}: {key} has rope_type {rope_type!r}; only unscaled RoPE ('default') is supported")
    dropout = hf.get("attention_dropout") or 0.0
    if not isinstance(dropout, int | float) or isinstance(dropout, bool):
        raise DataError(f"{source}: attention_dropout is {shown(dropout)}; expected a number")
    if dropout != 0.0:
        log.warning("%s: attention_dropout %s is dropped: our model has no dropout", source, hf["attention_dropout"])
    values: dict[str, Any] = {}
    fields = CONFIG_FIELDS
    if isinstance(mt.norm_eps, str):
        fields += (ConfigField(mt.norm_eps, "layer_norm_eps", float),)
    else:
        values["layer_norm_eps"] = mt.norm_eps
    for f in fields:
        raw = f.read(hf) if f.read else hf.get(f.theirs)
        # a JSON value of the field's own kind only: int("12") or float("1e-6") would accept a quoted number, and
        # float("abc") raise a traceback; an int field takes no fraction, a float field no bool
        if f.kind is bool:
            ok = isinstance(raw, bool)
        else:
            ok = isinstance(raw, int | float) and not isinstance(raw, bool)
            ok = ok and (f.kind is float or float(raw or 0).is_integer())
        if not ok:
            raise DataError(f"{source}: {f.theirs} is {shown(raw)}; expected a {f.kind.__name__}")
        values[f.ours] = f.kind(raw)
        if f.kind in (int, float) and not 0 < values[f.ours] < math.inf:
            raise DataError(f"{source}: {f.theirs} is {shown(raw)}; it must be a positive number")
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
    if mt.windows:
        values.update(read_olmo3(hf, values["n_layers"], source))
    return ModelConfig(**values, **dataclasses.asdict(mt.block))


def to_hf_state(
    state: dict[str, torch.Tensor], model: ModelConfig, source: str = "the model state"
) -> dict[str, torch.Tensor]:
    """Our state dict under transformers' names (the tied output head left out: transformers ties it on load)."""
    mt = model_type_for(model)
    return to_their_state(mt.tensors, state, model, mt.name, source)


def from_hf_state(
    hf_state: dict[str, torch.Tensor], hf_cfg: dict[str, Any], source: str = "the model"
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict for a transformers model. `vocab_size` is the config's (the embedding rows):
    `read_hf_dir` narrows it to the tokenizer's."""
    model = model_config_from_hf(hf_cfg, f"{source}/{CONFIG_JSON}")
    mt = MODEL_TYPES[hf_cfg["model_type"]]
    return model, to_our_state(mt.tensors, dict(hf_state), model, mt.name, source)


# ---- files --------------------------------------------------------------------------------------------------


def read_hf_dir(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict for a transformers model directory (or hub id).

    `vocab_size` is the directory tokenizer's vocabulary and `embedding_size` the padded row count when it is
    larger (OLMo-2 pads 100278 ids to 100352 rows), so the config says both what the tokenizer produces and what
    the weights hold.
    """
    directory = local_model_dir(path)
    hf_cfg = read_json(directory / CONFIG_JSON, "config")
    if is_hf_olmo(hf_cfg):  # ai2-olmo's own format (DataDecide): OLMo's config keys, fused weights
        return read_hf_olmo(str(directory))
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
    rename = renamer(model_type_for(model).tensors.pairs())
    return {rename(k) or k for k in expected_shapes(model) if not (model.weight_tying and k == "lm_head.weight")}
