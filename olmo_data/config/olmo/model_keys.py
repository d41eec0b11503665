"""OLMo's `model:` keys against our ModelConfig: OLMo's defaults, the keys our model computes under another
meaning, and the options it does not have, refused by key. One table for both readers of OLMo's model configs:
`convert/olmo_native.py` (importing OLMo's checkpoints) and `translate.py` (training from OLMo's YAML, which also
checks dropout and the initialisation, as they shape a model trained from scratch).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from olmo_data.config.schema import ConfigError

# OLMo's ModelConfig defaults (olmo/config.py) for the keys read here: what OLMo builds when a config leaves a key
# out. They are GPT-2's, not ours.
OLMO_DEFAULTS: dict[str, Any] = {
    "d_model": 768,
    "n_heads": 12,
    "n_kv_heads": None,
    "multi_query_attention": None,
    "n_layers": 12,
    "mlp_ratio": 4,
    "mlp_hidden_size": None,
    "vocab_size": 50257,
    "embedding_size": 50304,
    "max_sequence_length": 1024,
    "rope_theta": 10_000,
    "layer_norm_type": "default",
    "layer_norm_with_affine": True,
    "layer_norm_eps": 1e-5,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "norm_after": False,
    "weight_tying": True,
    "init_std": 0.02,
    "block_type": "sequential",
    "block_group_size": 1,
    "activation_type": "swiglu",
    "alibi": False,
    "rope": False,
    "include_bias": True,
    "bias_for_layer_norm": None,
    "clip_qkv": None,
    "scale_logits": False,
    "embedding_layer_norm": False,
}

# OLMo's LayerNorm kinds: "low_precision" is the same LayerNorm run in the autocast dtype (identical in fp32)
_NORM_TYPES = {"default": "layer_norm", "low_precision": "layer_norm", "rms": "rms"}


def yaml_text(value: Any) -> str:
    """A value as the YAML file spells it, for messages."""
    return json.dumps(value) if value is None or isinstance(value, (bool, str)) else str(value)


def as_kind(value: Any, kind: type, where: str) -> Any:
    """`value` as an int, float, bool or str, or a refusal; a float may be a string, as PyYAML reads `1e-6`."""
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{where} is {yaml_text(value)}; expected a {kind.__name__}")


def _kv_heads(olmo: dict[str, Any]) -> Any:
    """OLMo's effective_n_kv_heads: n_kv_heads, else 1 with the older multi_query_attention flag, else n_heads."""
    n, mqa = olmo["n_kv_heads"], olmo["multi_query_attention"]
    if n is None:
        return 1 if mqa else olmo["n_heads"]
    if mqa is not None and n != (1 if mqa else olmo["n_heads"]):
        raise ConfigError(
            f"model.n_kv_heads is {n} with model.multi_query_attention {yaml_text(mqa)}; OLMo itself refuses both"
        )
    return n


def _mlp_hidden(olmo: dict[str, Any]) -> Any:
    """Our SwiGLU hidden size: half of OLMo's fused ff_proj width (up and gate side by side), which is
    mlp_hidden_size, else mlp_ratio * d_model."""
    fused = olmo["mlp_hidden_size"]
    if fused is None:
        fused = as_kind(olmo["mlp_ratio"], int, "model.mlp_ratio") * as_kind(olmo["d_model"], int, "model.d_model")
    if not isinstance(fused, int) or isinstance(fused, bool) or fused % 2:
        raise ConfigError(f"model.mlp_hidden_size (ff_proj's width) is {fused!r}; expected an even int (up + gate)")
    return fused // 2


def _norm_type(olmo: dict[str, Any]) -> Any:
    kind = olmo["layer_norm_type"]
    if kind not in _NORM_TYPES:
        raise ConfigError(f"model.layer_norm_type is {yaml_text(kind)}; OLMo's kinds are {', '.join(_NORM_TYPES)}")
    return _NORM_TYPES[kind]


# OLMo's model keys and our ModelConfig fields: (their key, our field, kind, how to read it where the meaning
# differs). olmo_native.py adds how to write each back for its export.
MODEL_KEYS: tuple[tuple[str, str, type, Callable[[dict[str, Any]], Any] | None], ...] = (
    ("d_model", "d_model", int, None),
    ("n_heads", "n_heads", int, None),
    ("n_kv_heads", "n_kv_heads", int, _kv_heads),
    ("n_layers", "n_layers", int, None),
    ("mlp_hidden_size", "mlp_hidden_size", int, _mlp_hidden),
    ("vocab_size", "vocab_size", int, None),
    ("embedding_size", "embedding_size", int, lambda o: o["embedding_size"] or o["vocab_size"]),
    ("max_sequence_length", "max_sequence_length", int, None),
    ("rope_theta", "rope_theta", float, None),
    ("layer_norm_type", "layer_norm_type", str, _norm_type),
    ("layer_norm_with_affine", "layer_norm_with_affine", bool, None),
    ("layer_norm_eps", "layer_norm_eps", float, None),
    ("attention_layer_norm", "attention_layer_norm", bool, None),
    ("norm_after", "norm_after", bool, None),
    ("weight_tying", "weight_tying", bool, None),
    ("init_std", "init_std", float, None),
)

# OLMo options our model does not have: the values under which they change nothing, and what else would be needed
REQUIRED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("block_type", ("sequential",), "the llama and MoE blocks are other architectures"),
    ("activation_type", ("swiglu",), "our MLP is SwiGLU"),
    ("alibi", (False,), "positions are RoPE only"),
    ("rope", (True,), "positions are RoPE only"),
    ("include_bias", (False,), "our linear layers have no biases"),
    ("bias_for_layer_norm", (None, False), "our norms have no biases"),
    ("clip_qkv", (None,), "our attention does not clip q, k and v"),
    ("scale_logits", (False,), "our logits are not scaled"),
    ("embedding_layer_norm", (False,), "our embeddings are not normalised"),
)

# OLMo's keys that change nothing a trained model computes: dropout (ours has none), initialisation, kernels,
# precision, special token ids (the tokenizer's business). Training checks the first two (TRAINING_REQUIRED).
IGNORED = frozenset(
    {
        "attention_dropout",
        "residual_dropout",
        "embedding_dropout",
        "flash_attention",
        "init_device",
        "init_fn",
        "init_cutoff_factor",
        "scale_emb_init",
        "emb_init_std",
        "precision",
        "rope_full_precision",
        "alibi_bias_max",
        "eos_token_id",
        "pad_token_id",
    }
)

# what training from scratch adds to REQUIRED: OLMo's defaults for the keys absent from a file
TRAINING_DEFAULTS = {
    "attention_dropout": 0.1,
    "residual_dropout": 0.1,
    "embedding_dropout": 0.1,
    "init_fn": "normal",
    "init_cutoff_factor": None,
    "scale_emb_init": False,
    "emb_init_std": None,
    "flash_attention": False,
}
TRAINING_REQUIRED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    *(
        (k, (0.0, 0), "this model has no dropout")
        for k in ("attention_dropout", "residual_dropout", "embedding_dropout")
    ),
    ("init_fn", ("normal",), "weights start as a normal of init_std truncated at 3 std"),
    ("init_cutoff_factor", (3, 3.0), "the normal init is truncated at 3 std"),
    ("scale_emb_init", (False,), "the embedding starts as the other weights"),
    ("emb_init_std", (None,), "the embedding starts with init_std"),
)
# OLMo's model keys that only say how OLMo runs the same model
MODEL_NOT_APPLICABLE = ("init_device", "pad_token_id", "precision", "rope_full_precision", "alibi_bias_max")


def refuse_unless(
    values: dict[str, Any], given: dict[str, Any], table: Any, source: str, ending: str, prefix: str = "model."
) -> None:
    """Refuse, by key, the first value of `table`'s keys that is none of its allowed values (compared with their
    type: `1` is not `true`); `given` tells a value the file set from one OLMo's default supplied. A key absent
    from `values` too is at OLMo's default, the first allowed value."""
    for key, allowed, why in table:
        if key not in values:
            continue
        value = values[key]
        if not any(type(value) is type(a) and value == a for a in allowed):
            absent = "" if key in given else " (OLMo's default: the key is absent)"
            raise ConfigError(
                f"{source}: {prefix}{key} is {yaml_text(value)}{absent}; only {' or '.join(map(yaml_text, allowed))} "
                f"{ending} ({why})"
            )


def refuse_other_model(section: dict[str, Any], source: str, verb: str = "imported", prefix: str = "model.") -> None:
    """Refuse, by key, any option of the `model:` section of an OLMo config that would make OLMo's model compute
    something ours does not. `verb` says what is refused (imported, trained); `prefix` is how a key is named in
    the message (an hf_olmo config.json has OLMo's keys at its top level)."""
    olmo = {**OLMO_DEFAULTS, **section}
    refuse_unless(olmo, section, REQUIRED, source, f"can be {verb}", prefix)
    unknown = sorted(k for k, v in section.items() if k not in OLMO_DEFAULTS and k not in IGNORED and v)
    if unknown:
        key, who = unknown[0], "import" if verb == "imported" else "trainer"
        raise ConfigError(
            f"{source}: {prefix}{key} is {yaml_text(section[key])}, an OLMo option this {who} does not know; it "
            "cannot tell what the model computes with it"
        )
    if olmo["attention_layer_norm"] and not olmo["attention_layer_norm_with_affine"]:
        raise ConfigError(
            f"{source}: {prefix}attention_layer_norm_with_affine is false; only true can be {verb} (our QK-norm "
            "has a learned scale)"
        )


def model_values(section: dict[str, Any], source: str, prefix: str = "model.") -> dict[str, Any]:
    """Our ModelConfig's values for the `model:` section of an OLMo config, each checked for its kind: the
    shape and sizes, which the data tools need too (the instance length is max_sequence_length) even where
    `refuse_other_model` would refuse the model itself. `prefix` as in `refuse_other_model`."""
    olmo = {**OLMO_DEFAULTS, **section}
    values: dict[str, Any] = {}
    for theirs, ours, kind, read in MODEL_KEYS:
        try:
            raw = read(olmo) if read else olmo[theirs]
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from e
        values[ours] = as_kind(raw, kind, f"{source}: {prefix}{theirs}")
    if values["embedding_size"] == values["vocab_size"]:
        values["embedding_size"] = None
    return values


def model_values_from_olmo(
    section: dict[str, Any], source: str, verb: str = "imported", prefix: str = "model."
) -> dict[str, Any]:
    """`model_values` of a section `refuse_other_model` lets through: what importing OLMo's checkpoint needs."""
    refuse_other_model(section, source, verb, prefix)
    return model_values(section, source, prefix)
