"""Config values checked by what they mean, key by key, before anything is written or started.

A value of the right type can still be nonsense: `max_grad_norm: -1` clips every gradient to a negative norm (the
run trains uphill), `model.n_layers: -1` builds a model with no layers, `save_num_checkpoints_to_keep: 0` deletes
the checkpoint just saved. Each rule here names its key; `config.py` refuses the first broken one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from olmo_data.errors import shown

# sizes and counts: at least 1 (None, where allowed, keeps its meaning: "derived" or "off")
POSITIVE = (
    "model.d_model",
    "model.n_heads",
    "model.n_kv_heads",
    "model.n_layers",
    "model.mlp_hidden_size",
    "model.vocab_size",
    "model.embedding_size",
    "model.max_sequence_length",
    "console_log_interval",
    "save_interval",
    "save_interval_unsharded",
    "eval_interval",
    "stop_at",
    "scheduler.t_max",
    "scheduler.t_decay",
    "data.instance_filter.repetition_max_period",
    "data.instance_filter.repetition_min_period",
    "data.instance_filter.repetition_max_count",
)
# quantities that must be above zero: a zero would divide or make the run meaningless
ABOVE_ZERO = (
    "max_grad_norm",
    "model.rope_theta",
    "model.layer_norm_eps",
    "optimizer.eps",
    "peak_flops_per_device",
    "save_folder_lock_timeout_s",
    "z_loss_multiplier",
)
NON_NEGATIVE = (
    "seed",
    "optimizer.learning_rate",
    "optimizer.weight_decay",
    "model.init_std",
    "scheduler.t_warmup",
    "scheduler.alpha_f",
    "scheduler.warmup_min_lr",
)
KEEP_COUNTS = ("save_num_checkpoints_to_keep", "save_num_unsharded_checkpoints_to_keep")


def get_dotted(cfg: Any, dotted: str) -> Any:
    """The value of a dotted config key (`model.n_heads`) in a config object."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def float_values(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every float in a config dataclass (nested sections, lists such as `optimizer.betas` and `evaluators`
    included), by dotted key."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            where = key if i is None else f"{key}[{i}]"
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                yield from float_values(item, f"{where}.")
            elif isinstance(item, float):
                yield where, item


def problems(cfg: Any) -> list[str]:
    """Every value of `cfg` (a TrainConfig) that breaks its key's rule, as messages naming the key."""
    # NaN passes every comparison it is not the subject of, and an infinite rate or norm trains into NaNs
    out = [
        f"config key {key!r}: must be a finite number, got {value}"
        for key, value in float_values(cfg)
        if not math.isfinite(value)
    ]
    for key in POSITIVE:
        value = get_dotted(cfg, key)
        if value is not None and value < 1:
            out.append(f"config key {key!r}: must be positive, got {shown(value)}")
    for key in ABOVE_ZERO:
        value = get_dotted(cfg, key)
        if value is not None and not value > 0:  # `not >` also refuses NaN
            hint = " (or null for no clipping)" if key == "max_grad_norm" else ""
            out.append(f"config key {key!r}: must be above 0{hint}, got {shown(value)}")
    for key in NON_NEGATIVE:
        value = get_dotted(cfg, key)
        if not value >= 0:
            out.append(f"config key {key!r}: must be 0 or more, got {shown(value)}")
    for key in KEEP_COUNTS:
        value = get_dotted(cfg, key)
        if value == 0 or value < -1:
            out.append(
                f"config key {key!r}: got {value}; -1 keeps every checkpoint, N >= 1 the newest N (0 would delete "
                "the checkpoint just saved too)"
            )
    betas = cfg.optimizer.betas
    if len(betas) == 2 and not all(0 <= b < 1 for b in betas):
        out.append(f"config key 'optimizer.betas': each must be in [0, 1), got {shown(betas)}")
    rf = cfg.data.instance_filter
    if rf.repetition_min_period > rf.repetition_max_period:
        out.append(
            f"config key 'data.instance_filter.repetition_min_period': {rf.repetition_min_period} is above "
            f"data.instance_filter.repetition_max_period ({rf.repetition_max_period}); no period would be checked"
        )
    if cfg.eval_subset_num_batches == 0 or cfg.eval_subset_num_batches < -1:
        out.append(
            f"config key 'eval_subset_num_batches': -1 (every batch) or N >= 1, got {cfg.eval_subset_num_batches}"
        )
    out += window_and_rope_problems(cfg.model)
    for i, ev in enumerate(cfg.evaluators):
        if ev.max_batches is not None and ev.max_batches < 1:
            out.append(f"config key 'evaluators[{i}].max_batches': must be positive, got {ev.max_batches}")
    return out


def window_and_rope_problems(model: Any) -> list[str]:
    """The attention windows (each layer's, by either form: `ModelConfig.attention_windows`) and the YaRN settings
    of a ModelConfig, as messages naming the key."""
    from olmo_data.config.schema import ConfigError

    try:
        model.attention_windows()
        yarn = model.yarn()
    except ConfigError as e:
        return [str(e)]
    if yarn is None:
        return []
    key = "model.rope.scaling" if model.rope is not None and model.rope.scaling is not None else "model.rope_scaling"
    out = []
    if yarn.rope_type != "yarn":
        out.append(f"config key '{key}.rope_type': got {shown(yarn.rope_type)}; only yarn is computed")
    if not yarn.factor >= 1:
        out.append(f"config key '{key}.factor': must be 1 or more (the context's extension), got {yarn.factor}")
    if yarn.original_max_position_embeddings < 1:
        name = "old_context_len" if key == "model.rope.scaling" else "original_max_position_embeddings"
        out.append(f"config key '{key}.{name}': must be positive, got {yarn.original_max_position_embeddings}")
    if not yarn.beta_fast > yarn.beta_slow > 0:
        out.append(
            f"config key '{key}.beta_fast': beta_fast ({yarn.beta_fast}) must be above beta_slow ({yarn.beta_slow}), "
            "and both above 0"
        )
    if yarn.attention_factor is not None and not yarn.attention_factor > 0:
        out.append(f"config key '{key}.attention_factor': must be above 0, got {yarn.attention_factor}")
    return out
