"""OLMo-core's run config (the `config.json` its ConfigSaverCallback writes into each checkpoint) as our model and
optimizer settings, for `import-olmo-core` (olmo_core.py).

OLMo-core writes its config with `as_config_dict()`: every dataclass as a dict with its class under `_CLASS_`, and every
field whose value is None left out. So a key that is absent means the field's default in OLMo-core's source, and several
of those defaults differ from what an OLMo 2 run states: a linear's `bias` left out is *on*, a norm's `eps` left out is
1e-5. Each section below lists the keys OLMo-core 3.0 has, with that default, and reads them strictly: a value that
would make OLMo-core's model compute something ours does not (biases, MoE, gated attention, interleaved RoPE, per-head
QK-norm, ...) is refused by its key; settings of OLMo-core's machinery that do not change what the model computes
(dtypes, kernels, backends, fp8) are listed and ignored. A key this table does not know is ignored only when it is null
or false (a feature left off), and refused otherwise, so a later OLMo-core's new option cannot be silently dropped.
Nothing in the file is executed or imported: `_CLASS_` is only compared with the names OLMo-core uses. OLMo 3's
attention windows (`sliding_window`, OLMo-core's own keys, which our ModelConfig shares) and its YaRN on the
full-attention layers (`with_rope_scaling`'s `block_overrides`: the block again with `rope.scaling`, on exactly those
layers) are read; any other override or scaling is refused.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from olmo_data.config import ModelConfig, OptimizerConfig, RopeConfig, SlidingWindowConfig, YaRNScalingConfig
from olmo_data.errors import DataError, shown

log = logging.getLogger(__name__)

_ABSENT = object()
# how OLMo-core's machinery runs the model (precision, kernels, parallelism), not what it computes
_INFRA: tuple[str, ...] = ("dtype", "backend", "use_flash", "full_precision", "loss_implementation", "init_method")
_INFRA += ("init_seed",)
_INFRA += ("embedding_init_std", "freeze_params", "use_recompute_qkv_prep", "mxfp8_save_qkv_for_backward")
_INFRA += ("mxfp8_projections", "mxfp8_qkv_projection", "mxfp8_out_projection", "type", "_CLASS_")
NORM_KINDS = {"rms": "rms", "fused_rms": "rms", "default": "layer_norm"}  # same arithmetic, other kernels


class Section:
    """One dataclass of the config (`where` is its dotted key), read key by key against OLMo-core's defaults."""

    def __init__(self, value: Any, where: str, source: str, known: dict[str, Any], classes: tuple[str, ...]) -> None:
        if not isinstance(value, dict):
            raise DataError(f"{source}: {where} must be a mapping (an OLMo-core config section), got {shown(value)}")
        cls = value.get("_CLASS_")
        if cls is not None and str(cls).rsplit(".", 1)[-1] not in classes:
            raise DataError(
                f"{source}: {where} is a {cls}; only {' or '.join(classes)} can be imported (our model computes no "
                "other)"
            )
        self.value, self.where, self.source, self.known = value, where, source, known
        for key, v in value.items():
            if key in known or key in _INFRA:
                continue
            if v is None or v is False:
                log.info("%s: %s.%s is %s, an option this import does not know; off, so ignored", source, where, key, v)
                continue
            raise DataError(
                f"{source}: {where}.{key} is {shown(v)}, an OLMo-core option this import does not know; refused "
                "rather than imported as a model that computes something else"
            )

    def key(self, name: str) -> str:
        return f"{self.where}.{name}"

    def get(self, name: str) -> Any:
        """The value, or OLMo-core's default when the file leaves the key out."""
        value = self.value.get(name, _ABSENT)
        if value is _ABSENT or value is None:
            return self.known[name]
        return value

    def require(self, name: str, allowed: tuple[Any, ...], why: str) -> Any:
        """The value, refused by key unless it is one of `allowed` (an absent key: OLMo-core's default)."""
        value = self.get(name)
        if value not in allowed:
            default = " (OLMo-core's default: the key is absent)" if name not in self.value else ""
            choices = " or ".join(_spelled(a) for a in allowed)
            raise DataError(
                f"{self.source}: {self.key(name)} is {_spelled(value)}{default}; only {choices} can be imported ({why})"
            )
        return value

    def section(self, name: str, known: dict[str, Any], classes: tuple[str, ...]) -> Section:
        return Section(self.value.get(name), self.key(name), self.source, known, classes)


def _spelled(v: Any) -> str:
    return "null" if v is None else "true" if v is True else "false" if v is False else repr(v)


_NORM: dict[str, Any] = {"name": "default", "eps": 1e-5, "elementwise_affine": True, "bias": True}
_ROPE: dict[str, Any] = {"name": "default", "theta": 500_000, "no_global_rope": False, "scaling": None}
_ROPE |= {"partial_rotary_factor": 1.0}
_ATTENTION: dict[str, Any] = {"name": "default", "n_heads": 16, "n_kv_heads": None, "head_dim": None, "bias": True}
_ATTENTION |= {"gate": None}
_ATTENTION |= {"rope": None, "clip_qkv": None, "qk_norm": None, "dropout": 0.0, "sliding_window": None}
_ATTENTION |= {"use_head_qk_norm": False, "scalable_softmax": False, "qk_norm_per_head_gains": False}
_ATTENTION |= {"attention_sinks": False}
_FEED_FORWARD: dict[str, Any] = {"hidden_size": None, "name": "default", "bias": True, "activation": "silu"}
_BLOCK: dict[str, Any] = {"sequence_mixer": None, "attention": None, "layer_norm": None, "feed_forward": None}
_BLOCK |= {"feed_forward_moe": None, "name": "default", "dropout": 0.0}
_BLOCK |= {"attention_residual_alpha": 1.0, "feed_forward_residual_alpha": 1.0}
_LM_HEAD: dict[str, Any] = {"name": "default", "layer_norm": None, "bias": True}
_MODEL: dict[str, Any] = {"d_model": None, "vocab_size": None, "n_layers": None, "block": None, "lm_head": None}
_MODEL |= {"embedding_norm": None, "name": "default", "init_std": 0.02, "block_pattern": None}
_MODEL |= {"block_overrides": None, "embed_scale": None, "tie_word_embeddings": False}
_WINDOW: dict[str, Any] = {"pattern": None, "force_full_attention_on_first_layer": True}
_WINDOW |= {"force_full_attention_on_last_layer": True}
_YARN: dict[str, Any] = {"factor": 8.0, "beta_fast": 32, "beta_slow": 1, "old_context_len": 8192}
BLOCK_KINDS = {"reordered_norm": True, "default": False}  # block name -> our norm_after


@dataclass(frozen=True)
class Norm:
    kind: str
    eps: float
    affine: bool


def _norm(parent: Section, name: str) -> Norm | None:
    if parent.value.get(name) is None:
        return None
    s = parent.section(name, _NORM, ("LayerNormConfig",))
    kind = s.require("name", tuple(NORM_KINDS), "RMSNorm, or LayerNorm without bias")
    affine = bool(s.get("elementwise_affine"))
    if affine:
        s.require("bias", (False,), "our norms have no bias")
    return Norm(NORM_KINDS[kind], _float(s, "eps", positive=True), affine)


def _float(s: Section, name: str, *, positive: bool = False) -> float:
    """A finite number (an int or a float, never a string or a bool), or one line naming the key."""
    value = s.get(name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0) or (not positive and value < 0):
        sign = "positive" if positive else "non-negative"
        raise DataError(f"{s.source}: {s.key(name)} must be a finite {sign} number, got {shown(value)}")
    return float(value)


def _int(s: Section, name: str) -> int:
    value = s.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DataError(f"{s.source}: {s.key(name)} must be a positive integer, got {shown(value)}")
    return value


def model_config_from_olmo_core(config: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig for the run config an OLMo-core checkpoint carries, refusing by key what ours cannot compute."""
    m = Section(config.get("model"), "model", source, _MODEL, ("TransformerConfig",))
    m.require("name", ("default",), "a dense decoder; MoE and normalized transformers have no counterpart here")
    for key in ("embedding_norm", "block_pattern", "embed_scale"):
        m.require(key, (None,), "every block alike, embeddings used as they are")
    d_model, rows, n_layers = _int(m, "d_model"), _int(m, "vocab_size"), _int(m, "n_layers")
    block = m.section("block", _BLOCK, ("TransformerBlockConfig",))
    norm_after = BLOCK_KINDS[block.require("name", tuple(BLOCK_KINDS), "OLMo 2's reordered norm or the pre-norm block")]
    block.require("feed_forward_moe", (None,), "a dense MLP")
    block.require("dropout", (0.0, 0), "no dropout")
    for key in ("attention_residual_alpha", "feed_forward_residual_alpha"):
        block.require(key, (1.0, 1), "residuals added unscaled")
    mixer = "sequence_mixer" if block.value.get("sequence_mixer") is not None else "attention"
    att = block.section(mixer, _ATTENTION, ("AttentionConfig",))
    att.require("name", ("default",), "separate q, k, v projections; fused and other attentions are not read")
    att.require("bias", (False,), "our projections have no bias")
    for key, why in (("gate", "no output gate"), ("clip_qkv", "no clipping")):
        att.require(key, (None,), why)
    window = _sliding_window(att)
    att.require("dropout", (0.0, 0), "no dropout")
    for key in ("use_head_qk_norm", "scalable_softmax", "qk_norm_per_head_gains", "attention_sinks"):
        att.require(key, (False,), "QK-norm over the whole projection, plain softmax")
    heads = _int(att, "n_heads")
    kv_heads = att.get("n_kv_heads")
    if d_model % heads or (d_model // heads) % 2:
        raise DataError(f"{source}: {att.key('n_heads')} {heads} does not split d_model {d_model} into even heads")
    att.require("head_dim", (None, d_model // heads), "heads of d_model / n_heads")
    if kv_heads is not None and (not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads):
        raise DataError(f"{source}: {att.key('n_kv_heads')} {shown(kv_heads)} does not divide n_heads {heads}")
    if att.value.get("rope") is None:
        raise DataError(f"{source}: {att.key('rope')} is absent (no positions); only RoPE can be imported")
    rope = att.section("rope", _ROPE, ("RoPEConfig",))
    rope.require("name", ("default", "fused"), "rotate-half RoPE; complex (interleaved) RoPE is not read")
    rope.require("no_global_rope", (False,), "RoPE in every layer")
    windows = ModelConfig(n_layers=n_layers, sliding_window=window).attention_windows()
    scaling = _rope_scaling(m, block, rope, windows)
    rope.require("partial_rotary_factor", (1.0, 1), "RoPE over the whole head")
    norm = _norm(block, "layer_norm")
    if norm is None:
        raise DataError(f"{source}: {block.key('layer_norm')} is absent; our blocks have norms")
    qk_norm = _norm(att, "qk_norm")
    if qk_norm is not None and (qk_norm.kind, qk_norm.eps, qk_norm.affine) != (norm.kind, norm.eps, True):
        raise DataError(
            f"{source}: {att.key('qk_norm')} is {qk_norm}; only the block's own norm ({norm.kind}, eps {norm.eps}) "
            "with learned scales can be imported (our QK-norm is that norm)"
        )
    head = m.section("lm_head", _LM_HEAD, ("LMHeadConfig",))
    head.require("name", ("default",), "a plain linear output head")
    head.require("bias", (False,), "our output head has no bias")
    final = _norm(head, "layer_norm")
    if final != norm:
        raise DataError(
            f"{source}: {head.key('layer_norm')} is {final}; only the blocks' own norm ({norm}) can be imported (our "
            "final norm is that norm)"
        )
    ff = block.section("feed_forward", _FEED_FORWARD, ("FeedForwardConfig",))
    ff.require("name", ("default",), "a SwiGLU MLP")
    ff.require("bias", (False,), "our MLP has no bias")
    ff.require("activation", ("silu",), "SwiGLU")
    tokens = _tokenizer_vocab(config, rows)
    return ModelConfig(
        d_model=d_model,
        n_heads=heads,
        n_kv_heads=kv_heads if kv_heads not in (None, heads) else None,
        n_layers=n_layers,
        mlp_hidden_size=_int(ff, "hidden_size"),
        vocab_size=tokens,
        embedding_size=rows if rows != tokens else None,
        max_sequence_length=_sequence_length(config),
        rope_theta=_float(rope, "theta", positive=True),
        layer_norm_eps=norm.eps,
        layer_norm_type=norm.kind,
        layer_norm_with_affine=norm.affine,
        attention_layer_norm=qk_norm is not None,
        norm_after=norm_after,
        weight_tying=bool(m.get("tie_word_embeddings")),
        init_std=_float(m, "init_std"),
        sliding_window=window,
        rope=RopeConfig(scaling=scaling) if scaling is not None else None,
    )


def _sliding_window(att: Section) -> SlidingWindowConfig | None:
    """OLMo-core's SlidingWindowAttentionConfig as ours (the same keys, the same first/last-layer rule)."""
    if att.value.get("sliding_window") is None:
        return None
    s = att.section("sliding_window", _WINDOW, ("SlidingWindowAttentionConfig",))
    pattern = s.get("pattern")
    ok = isinstance(pattern, list) and pattern
    if not ok or any(not isinstance(w, int) or isinstance(w, bool) or (w < 1 and w != -1) for w in pattern):
        raise DataError(
            f"{s.source}: {s.key('pattern')} is {shown(pattern)}; expected window sizes (>= 1 tokens) or -1 (full "
            "attention), at least one"
        )
    flags = [s.require(k, (True, False), "a boolean") for k in list(_WINDOW)[1:]]
    return SlidingWindowConfig(list(pattern), *flags)


def _yarn(rope: Section) -> YaRNScalingConfig | None:
    """The rope's `scaling`: OLMo-core's YaRNRoPEScalingConfig as ours; any other scaling refused by its class."""
    if rope.value.get("scaling") is None:
        return None
    if not isinstance(rope.value["scaling"], dict) or "_CLASS_" not in rope.value["scaling"]:
        raise DataError(f"{rope.source}: {rope.key('scaling')} has no _CLASS_; which RoPE scaling it is is unknown")
    s = rope.section("scaling", _YARN, ("YaRNRoPEScalingConfig",))
    factor, fast, slow = _float(s, "factor", positive=True), _float(s, "beta_fast"), _float(s, "beta_slow")
    return YaRNScalingConfig(factor, fast, slow, _int(s, "old_context_len"))


def _without_scaling(block: dict[str, Any], mixer: str) -> dict[str, Any]:
    rope = {k: v for k, v in block[mixer]["rope"].items() if k != "scaling"}
    return block | {mixer: block[mixer] | {"rope": rope}}


def _rope_scaling(m: Section, block: Section, rope: Section, windows: list[int | None]) -> YaRNScalingConfig | None:
    """YaRN on the full-attention layers, as ours computes it: the block's own rope.scaling when every layer is
    full attention, or (OLMo-core's `with_rope_scaling`) `block_overrides` that are the block with YaRN on exactly
    the full-attention layers. Any other override, or a scaling that would reach a windowed layer, is refused."""
    own = _yarn(rope)
    if own is not None and any(w is not None for w in windows):
        raise DataError(
            f"{rope.source}: {rope.key('scaling')} scales every layer, windowed ones too; only YaRN on the "
            "full-attention layers (OLMo-core's with_rope_scaling: block_overrides) can be imported"
        )
    overrides = m.value.get("block_overrides")
    if overrides is None:
        return own
    where = m.key("block_overrides")
    full = {i for i, w in enumerate(windows) if w is None}
    if own is not None or not isinstance(overrides, dict) or {str(i) for i in full} != set(map(str, overrides)):
        raise DataError(
            f"{m.source}: {where} overrides layers {sorted(overrides) if isinstance(overrides, dict) else overrides}; "
            f"only YaRN on exactly the full-attention layers {sorted(full)} can be imported (every block alike else)"
        )
    mixer = "sequence_mixer" if block.value.get("sequence_mixer") is not None else "attention"
    found: list[YaRNScalingConfig] = []
    for layer, override in overrides.items():
        here = f"{where}.{layer}"
        try:
            same = _without_scaling(override, mixer) == _without_scaling(block.value, mixer)
        except (AttributeError, KeyError, TypeError):
            same = False
        if not same:
            raise DataError(
                f"{m.source}: {here} differs from model.block in more than {mixer}.rope.scaling; only YaRN on the "
                "full-attention layers can be imported"
            )
        scaling = _yarn(Section(override[mixer]["rope"], f"{here}.{mixer}.rope", m.source, _ROPE, ("RoPEConfig",)))
        if scaling is None:
            raise DataError(f"{m.source}: {here}.{mixer}.rope.scaling is absent; the override then changes nothing")
        found.append(scaling)
    if any(f != found[0] for f in found):
        raise DataError(f"{m.source}: {where} scales its layers differently; only one YaRN for all can be imported")
    return found[0]


def _tokenizer_vocab(config: dict[str, Any], rows: int) -> int:
    """The tokenizer's vocabulary (OLMo-core's model.vocab_size is the embedding's rows, padded past it)."""
    dataset = config.get("dataset")
    tokenizer = dataset.get("tokenizer") if isinstance(dataset, dict) else None
    size = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
    return size if isinstance(size, int) and 0 < size <= rows else rows


def _sequence_length(config: dict[str, Any]) -> int:
    """The run's training length: the train module's, else the dataset's (1024 when the file states neither)."""
    for section, key in (("train_module", "max_sequence_length"), ("dataset", "sequence_length")):
        value = (config.get(section) or {}).get(key) if isinstance(config.get(section), dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return ModelConfig.max_sequence_length


_OPTIM: dict[str, Any] = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2, "group_overrides": None}
_OPTIM |= {"compile": False, "fixed_fields": None, "foreach": None, "fused": None}
_OPTIM |= {"step_increment_bugfix": True, "rolling_interval_length": 128, "sigma_factor": 6}


def optimizer_from_olmo_core(config: dict[str, Any], source: str) -> OptimizerConfig:
    """Our optimizer settings for the run's `train_module.optim`: AdamW, or OLMo-core's SkipStepAdamW (its AdamW
    update; the skipping of steps whose loss spikes is not done here). OLMo-core decays every parameter unless a
    group override says otherwise; the one override read is OLMo 2's, no decay on the embeddings."""
    train_module = config.get("train_module")
    if not isinstance(train_module, dict) or train_module.get("optim") is None:
        raise DataError(
            f"{source}: no train_module.optim; the optimizer state cannot be read without it (give --weights-only)"
        )
    s = Section(train_module["optim"], "train_module.optim", source, _OPTIM, ("AdamWConfig", "SkipStepAdamWConfig"))
    s.require("step_increment_bugfix", (True,), "AdamW's bias correction")
    decay_embeddings = True
    overrides = s.get("group_overrides") or []
    if not isinstance(overrides, list):
        raise DataError(f"{source}: {s.key('group_overrides')} is {shown(overrides)}; expected a list of overrides")
    for i, override in enumerate(overrides):
        where = s.key(f"group_overrides[{i}]")
        if not (
            isinstance(override, dict)
            and override.get("params") == ["embeddings.weight"]
            and override.get("opts") == {"weight_decay": 0.0}
        ):
            raise DataError(
                f"{source}: {where} is {shown(override)}; only OLMo 2's (params [embeddings.weight], opts "
                "{weight_decay: 0.0}) can be imported (give --weights-only to import the weights alone)"
            )
        decay_embeddings = False
    betas = s.get("betas")
    if not (
        isinstance(betas, list)
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
    ):
        raise DataError(f"{source}: {s.key('betas')} must be two numbers in [0, 1), got {shown(betas)}")
    return OptimizerConfig(
        name="adamw",
        learning_rate=_float(s, "lr"),
        weight_decay=_float(s, "weight_decay"),
        betas=[float(b) for b in betas],
        eps=_float(s, "eps", positive=True),
        decay_norm_and_bias=True,
        decay_embeddings=decay_embeddings,
    )


def max_grad_norm(config: dict[str, Any]) -> float | None:
    """The run's gradient clipping (`train_module.max_grad_norm`; OLMo-core clips nothing when it is absent)."""
    train_module = config.get("train_module")
    value = train_module.get("max_grad_norm") if isinstance(train_module, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
