"""transformers' `olmo3` config fields: attention windows per layer and YaRN on the full-attention layers.

OLMo 3 is OLMo 2's block (the same tensors) with `layer_types` (sliding_attention | full_attention, one per layer),
one `sliding_window` for the sliding layers, and RoPE parameters per layer type. transformers 5 writes those as
`rope_parameters: {full_attention: {...}, sliding_attention: {...}}`; 4.57 wrote `rope_theta` and `rope_scaling`
(which 5 reads as the full-attention layers' parameters). An export writes both forms, so either version loads it
with the same parameters; an import reads either, and refuses by name what our model does not compute: YaRN on the
sliding layers, two RoPE bases, another rope_type, a YaRN key we do not know.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from olmo_data.config import ModelConfig, RopeScalingConfig
from olmo_data.errors import DataError, shown

SLIDING, FULL = "sliding_attention", "full_attention"
_YARN_KEYS = {f.name for f in dataclasses.fields(RopeScalingConfig)} | {"rope_theta", "truncate", "type"}


def needs_olmo3(model: ModelConfig) -> bool:
    """Whether `model` has what only olmo3 expresses: windows (or explicit layer types) or RoPE scaling."""
    return model.sliding_window is not None or model.layer_types is not None or model.yarn() is not None


def olmo3_fields(model: ModelConfig) -> dict[str, Any]:
    """config.json's olmo3 fields for `model`: layer types, the window, RoPE per layer type in both forms."""
    windows = model.attention_windows()
    sizes = sorted({w for w in windows if w is not None})
    if len(sizes) > 1:
        raise DataError(
            f"attention windows of {sizes} tokens: transformers' olmo3 has one sliding_window for all its sliding "
            "layers; export a model whose windowed layers share one size"
        )
    window = sizes[0] if sizes else (model.sliding_window if isinstance(model.sliding_window, int) else None)
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(model.rope_theta)}
    yarn = model.yarn()
    scaling = None
    if yarn is not None:
        scaling = {k: v for k, v in dataclasses.asdict(yarn).items() if v is not None}
        full = {**scaling, "rope_theta": float(model.rope_theta)}
    return {
        "layer_types": [SLIDING if w is not None else FULL for w in windows],
        "sliding_window": window,
        "rope_parameters": {FULL: full, SLIDING: {"rope_type": "default", "rope_theta": float(model.rope_theta)}},
        "rope_scaling": scaling,  # transformers 4.57's form (5 reads it as the full-attention layers')
    }


def _rope_type(params: dict[str, Any]) -> str:
    return str(params.get("rope_type", params.get("type", "default")))


def read_olmo3(hf: dict[str, Any], n_layers: int, source: str) -> dict[str, Any]:
    """Our ModelConfig values for an olmo3 config's windows and YaRN (layer_types, sliding_window, rope_scaling),
    refusing what we would compute differently."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise DataError(f"{source}: rope_parameters is {shown(params)}; expected a mapping")
    nested = FULL in params or SLIDING in params
    top_theta = hf.get("rope_theta", params.get("rope_theta") if not nested else None)
    full = dict(params.get(FULL) or {}) if nested else dict(params)
    sliding = dict(params.get(SLIDING) or {}) if nested else {}
    scaling = hf.get("rope_scaling")
    if scaling:  # 4.57's form: the full-attention layers' parameters
        full = {**full, **scaling}
    thetas = {p.get("rope_theta", top_theta if top_theta is not None else 500_000.0) for p in (full, sliding)}
    if len(thetas) > 1:  # (transformers 5 gives the sliding layers its default 500000 when 4.57's form has another)
        raise DataError(
            f"{source}: rope_parameters give the layer types the RoPE bases {sorted(thetas)}; our model has one "
            "rope_theta for all layers"
        )
    if _rope_type(sliding) != "default":
        raise DataError(
            f"{source}: rope_parameters.{SLIDING} has rope_type {_rope_type(sliding)!r}; only the full-attention "
            "layers' RoPE can be scaled"
        )
    values: dict[str, Any] = {"rope_scaling": _yarn(full, hf, source)}  # rope_theta: hf._rope_theta
    layer_types = hf.get("layer_types")
    if layer_types is None:  # transformers' default: every fourth layer full
        layer_types = [SLIDING if (i + 1) % 4 else FULL for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers or set(layer_types) - {SLIDING, FULL}:
        raise DataError(
            f"{source}: layer_types is {shown(layer_types)}; expected {SLIDING} or {FULL} for each of the "
            f"{n_layers} layers"
        )
    window = hf.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise DataError(f"{source}: sliding_window is {shown(window)}; expected a number of tokens (1 or more)")
    if window is None and SLIDING in layer_types:
        raise DataError(f"{source}: sliding_window is null, but layer_types has {SLIDING} layers")
    values.update(layer_types=list(layer_types), sliding_window=window)
    return values


def _yarn(full: dict[str, Any], hf: dict[str, Any], source: str) -> RopeScalingConfig | None:
    kind = _rope_type(full)
    if kind == "default":
        return None
    if kind != "yarn":
        raise DataError(
            f"{source}: the full-attention layers' rope_type is {kind!r}; only default and yarn are computed"
        )
    unknown = sorted(set(full) - _YARN_KEYS)
    if unknown:
        raise DataError(f"{source}: YaRN parameter {unknown[0]!r} is not computed here (known: {sorted(_YARN_KEYS)})")
    if full.get("truncate", True) is not True:
        raise DataError(f"{source}: YaRN with truncate {shown(full['truncate'])}; only the truncated ramp is computed")
    original = full.get("original_max_position_embeddings")
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise DataError(f"{source}: YaRN's original_max_position_embeddings is {shown(original)}; expected tokens")
    factor = full.get("factor")
    if factor is None:  # transformers: the extension the config's context implies
        factor = hf["max_position_embeddings"] / original
    numbers = {k: full.get(k) for k in ("attention_factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow")}
    for key, value in {"factor": factor, **numbers}.items():
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or not value > 0):
            raise DataError(f"{source}: YaRN's {key} is {shown(value)}; expected a number above 0")
    return RopeScalingConfig(
        "yarn",
        float(factor),
        original,
        float(numbers["beta_fast"] or 32),  # transformers: `or` its defaults
        float(numbers["beta_slow"] or 1),
        *(None if numbers[k] is None else float(numbers[k]) for k in ("attention_factor", "mscale", "mscale_all_dim")),  # type: ignore[arg-type]
    )
