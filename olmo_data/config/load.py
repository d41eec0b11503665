"""The training config: typed dataclasses, loaded from YAML, overridden by `--key.sub=value` arguments.

Field names follow OLMo's where OLMo has one, so an OLMo user reads a config without a glossary. Every value
is checked against its field's type at start: a typo or a wrong type fails before any process group or model
exists, with the key, the problem and a suggestion. This module does not import torch, so loading a config is
cheap (the data tools read the same file).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from olmo_data.config.checks import get_dotted, problems
from olmo_data.config.olmo import olmo_form_key, translate
from olmo_data.config.olmo_core_form import olmo_core_form, refuse_olmo_core_form
from olmo_data.config.schema import (
    CHOICES,
    LORA_TARGETS,
    ConfigError,
    EvaluatorConfig,
    Float8Config,
    ReLoRAConfig,
    TrainConfig,
)
from olmo_data.errors import DataError, shown, yaml_problem

log = logging.getLogger(__name__)
_SUMMARIES_LOGGED: set[str] = set()
# a config file larger than this is refused unread: OLMo 3's config.json, naming thousands of token files, is
# about a megabyte
MAX_CONFIG_BYTES = 64 << 20

__all__ = [
    "check_cycles_divide",
    "check_schedule_fits",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parse_duration",
    "read_run_config",
    "save_config",
]


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    require_data: bool = True,
    training: bool = True,
) -> TrainConfig:
    """Read a YAML config and apply command-line overrides (`--key.sub=value`, `--key value`, `--flag`).

    A file in OLMo's own form (`allenai/OLMo`'s configs: recognised by a key only OLMo has) is translated into
    ours first (olmo_data/config/olmo), and what of it concerns OLMo's machinery only is logged in one line.

    `require_data=False` reads a config that describes a model but no training data yet (an imported model's,
    or a checkpoint's config read to rebuild its model): every other check still applies.

    `training=False` reads the config of a run to look at its data: an OLMo setting this trainer cannot train
    with (OLMo's `init_fn: mitchell`, dropout, `clip_qkv`, another optimizer) is refused only when `training`.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{path}: config file not found")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {p.stat().st_size:,} bytes, over the {MAX_CONFIG_BYTES:,} a config may have; not a config"
            )
        if p.suffix == ".json":
            olmo_core_form(str(p))  # a config.json cut short or nested too deep: JSON's one line, as every reader
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({yaml_problem(e)})") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text at byte {e.start}; not a config") from e
        except RecursionError as e:
            raise ConfigError(f"{path}: nested too deeply to read (thousands of levels); not a config") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
        raw = loaded or {}
    source = str(path) if path is not None else "config"
    return config_from_dict(raw, source, overrides, require_data=require_data, training=training)


def config_from_dict(
    raw: dict[str, Any],
    source: str = "config",
    overrides: list[str] | tuple[str, ...] = (),
    *,
    require_data: bool = True,
    training: bool = True,
) -> TrainConfig:
    """The TrainConfig of a config's keys as YAML gives them (a file's, or a dict a program built): the one path
    from keys to a config, for the trainer and every data command alike, so all of them see the same run
    (`training`: as for load_config)."""
    refuse_olmo_core_form(raw, source)
    raw = copy.deepcopy(raw)
    olmo_form = olmo_form_key(raw)  # by the file's own keys: an override never changes how it is read
    for key, text in _split_overrides(overrides):  # a string key keeps its text: --run_name=007 is not 7
        value = _parse_scalar(text)
        _set_dotted(raw, key, text if value is not None and _is_text_key(key) else value)
    if olmo_form is not None:  # OLMo's YAML (olmo_data/config/olmo): overrides in its names, then ours
        translation = translate(raw, source)
        if training and translation.untrainable:
            raise ConfigError(translation.untrainable[0])
        summary = translation.summary(source)
        if summary not in _SUMMARIES_LOGGED:  # a command reading the config twice says it once
            _SUMMARIES_LOGGED.add(summary)
            log.info("%s", summary)
        raw = translation.config
    try:
        cfg = _build(TrainConfig, raw, prefix="")
        cfg.evaluators = expand_evaluators(cfg.evaluators)
        _check(cfg, require_data=require_data)
    except ConfigError as e:  # which file, for a command reading several (a run's stages, a checkpoint's)
        if source == "config" or str(e).startswith(source):
            raise
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def read_run_config(config: str | dict[str, Any] | TrainConfig, *, require_data: bool = True) -> TrainConfig:
    """A run's config however a caller holds it (a YAML path, its keys, or the config itself), read as the
    trainer reads it: the data tools take this, never the YAML's keys directly, so OLMo's form, interpolations and
    defaults mean for `inspect-batch` exactly what they mean for the run. Only its data side is held to what this
    trainer can do: a model or optimizer setting it cannot train is refused when training starts, not here."""
    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, dict):
        return config_from_dict(config, require_data=require_data, training=False)
    return load_config(config, require_data=require_data, training=False)


def expand_evaluators(evaluators: list[EvaluatorConfig]) -> list[EvaluatorConfig]:
    """OLMo's `{type: lm, data: {datasets: {name: [paths]}}}` as one of our evaluators per named set (what OLMo
    logs separately); downstream evaluators name a task and no data. Labels are checked against ai2-olmo-eval's
    tasks when the run starts (olmo_train/train/downstream), as this module does not import it."""
    out = []
    for i, ev in enumerate(evaluators):
        if ev.type not in ("lm", "downstream"):
            close = difflib.get_close_matches(ev.type, ["lm", "downstream"], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"config key 'evaluators[{i}].type': got {shown(ev.type)}, expected lm or downstream{hint}"
            )
        if ev.type == "downstream":
            if ev.paths or ev.data is not None:
                raise ConfigError(f"config key 'evaluators[{i}]': a downstream evaluator ({ev.label}) reads no paths")
            out.append(ev)
            continue
        if ev.data is None:
            out.append(ev)
            continue
        named = dict(ev.data.datasets)
        if ev.data.paths or ev.paths:
            named[ev.label] = [*ev.paths, *ev.data.paths]
        if not named:
            raise ConfigError(f"config key 'evaluators[{i}].data': names no paths (data.datasets or data.paths)")
        dtype = ev.dtype or ev.data.memmap_dtype
        out.extend(EvaluatorConfig(label, "lm", list(paths), dtype, ev.max_batches) for label, paths in named.items())
    return out


def _split_overrides(args: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, the value's text as typed) for each override."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"{arg!r}: expected an override like --key.sub=value")
        key, eq, text = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                text = args[i + 1]
                i += 1
            else:
                text = "true"
        out.append((key.replace("-", "_"), text))
        i += 1
    return out


def _is_text_key(dotted: str) -> bool:
    """Whether a dotted key is a string field (`run_name`, `wandb.group`), whose override is its text as typed."""
    tp: Any = TrainConfig
    for part in dotted.split("."):
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in hints:
            return False
        tp = hints[part]
    return tp is str or tp == (str | None)


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the config"
    if raw is None and prefix:  # `model:` with nothing under it: an empty section, all defaults (YAML gives None)
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {shown(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
    kwargs = {key: _coerce(hints[key], value, f"{prefix}{key}") for key, value in raw.items()}
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it converted (ints to floats, tuples to lists)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        sections = [option for option in options if dataclasses.is_dataclass(option)]
        if isinstance(value, dict) and len(sections) == 1:  # a mapping is that section: its own message on a typo
            return _coerce(sections[0], value, key)
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"config key {key!r}: got {shown(value)}, expected {_type_name(tp)}")
    if origin is dict:  # {name: value}: names are text
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r}: got {shown(value)}, expected a mapping ({_type_name(tp)})")
        _, item_tp = typing.get_args(tp)
        return {str(k): _coerce(item_tp, v, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str) and item is str:
            value = [value]  # a single path where a list was expected
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: got {shown(value)}, expected a list ({_type_name(tp)}), e.g. [a,b]")
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, prefix=f"{key}.")  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # `run_name: 2024`
            return str(value)
    else:
        raise ConfigError(f"config key {key!r}: unsupported annotation {tp!r}")
    raise ConfigError(f"config key {key!r}: got {shown(value)} ({type(value).__name__}), expected {_type_name(tp)}")


def _check(cfg: TrainConfig, *, require_data: bool = True) -> None:
    for dotted, choices in CHOICES.items():
        value = get_dotted(cfg, dotted)
        if value is not None and value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"config key {dotted!r}: got {shown(value)}, expected one of {list(choices)}{hint}")
    for problem in problems(cfg)[:1]:  # before any arithmetic on them (n_heads: 0 would divide by zero below)
        raise ConfigError(problem)
    parse_duration(cfg.max_duration)
    _check_wsd(cfg)
    _check_relora(cfg)
    _check_float8(cfg)
    _check_needs(cfg)
    for key in ("global_train_batch_size", "device_train_microbatch_size", "device_eval_batch_size"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"config key {key!r}: must be positive, got {getattr(cfg, key)}")
    m = cfg.model
    if m.d_model % m.n_heads:
        raise ConfigError(f"config key 'model.d_model': {m.d_model} is not divisible by model.n_heads={m.n_heads}")
    if m.n_kv_heads is not None and m.n_heads % m.n_kv_heads:
        raise ConfigError(
            f"config key 'model.n_kv_heads': model.n_heads={m.n_heads} is not a multiple of {m.n_kv_heads}"
        )
    if (m.d_model // m.n_heads) % 2:
        raise ConfigError("config key 'model.d_model': the head size d_model/n_heads must be even for RoPE")
    if m.embedding_size is not None and m.embedding_size < m.vocab_size:
        raise ConfigError(f"config key 'model.embedding_size': {m.embedding_size} < model.vocab_size={m.vocab_size}")
    if len(cfg.optimizer.betas) != 2:
        raise ConfigError(f"config key 'optimizer.betas': expected two numbers, got {cfg.optimizer.betas}")
    if require_data and not cfg.data.paths and not cfg.data.mix and not cfg.data.olmo_core:
        raise ConfigError(
            "config: no training data; set data.paths (token files or directories), data.mix or data.olmo_core"
        )
    _check_olmo_core_data(cfg)
    if cfg.data.paths and cfg.data.mix:
        raise ConfigError("config: set either data.paths or data.mix, not both")
    if cfg.model.loss_chunk_tokens is not None and cfg.model.loss_chunk_tokens < 1:
        raise ConfigError(f"config key 'model.loss_chunk_tokens': must be positive, got {cfg.model.loss_chunk_tokens}")
    if cfg.data.prefetch_batches < 0:
        raise ConfigError(f"config key 'data.prefetch_batches': must be 0 or more, got {cfg.data.prefetch_batches}")
    if cfg.data.remote_concurrency is not None and cfg.data.remote_concurrency < 1:
        raise ConfigError(f"config key 'data.remote_concurrency': must be positive, got {cfg.data.remote_concurrency}")
    if cfg.data.label_mask_paths is not None and len(cfg.data.label_mask_paths) != len(cfg.data.paths):
        raise ConfigError(
            f"config key 'data.label_mask_paths': {len(cfg.data.label_mask_paths)} entries for "
            f"{len(cfg.data.paths)} data.paths; give one label mask per token file"
        )


def _check_olmo_core_data(cfg: TrainConfig) -> None:
    """data.olmo_core names the whole data side (files, order, batch size, instance filter): a key of ours that
    would change it is refused by name rather than silently overruled."""
    if not cfg.data.olmo_core:
        return
    d = cfg.data
    for key, value in (
        ("paths", d.paths),
        ("mix", d.mix),
        ("label_mask_paths", d.label_mask_paths),
        ("order_path", d.order_path),
        ("dtype", d.dtype),
    ):
        if value:
            raise ConfigError(
                f"config key 'data.{key}': data.olmo_core ({d.olmo_core}) gives the run's data; remove data.{key}"
            )
    if d.instance_filter.enabled:
        raise ConfigError(
            "config key 'data.instance_filter.enabled': with data.olmo_core the filter is the OLMo-core config's "
            "own (dataset.instance_filter_config); remove data.instance_filter"
        )


# (key, its default, the switch it only means something with): set without the switch, it would be silently ignored
_NEEDS = (
    ("model.document_positions", False, "model.document_masking"),
    ("model.document_attention", "auto", "model.document_masking"),
    ("model.activation_checkpointing_policy", "full", "model.activation_checkpointing"),
    ("data.instance_filter.repetition_max_period", 13, "data.instance_filter.enabled"),
    ("data.instance_filter.repetition_min_period", 1, "data.instance_filter.enabled"),
    ("data.instance_filter.repetition_max_count", 32, "data.instance_filter.enabled"),
)


def _check_needs(cfg: TrainConfig) -> None:
    for key, default, switch in _NEEDS:
        if get_dotted(cfg, key) != default and not get_dotted(cfg, switch):
            raise ConfigError(f"config key {key!r}: set, but {switch} is not, so it would do nothing; set {switch}")


def _check_wsd(cfg: TrainConfig) -> None:
    """wsd's decay is given one way, and only to wsd; where the schedule's length is known here, the warm-up and
    the decay must fit in it (else the rate would drop from the warm-up straight into the decay)."""
    s = cfg.scheduler
    given = [key for key in ("decay_fraction", "t_decay") if getattr(s, key) is not None]
    if s.name != "wsd":
        if given:
            raise ConfigError(
                f"config key 'scheduler.{given[0]}': set, but scheduler.name is {s.name!r}, which has no decay phase "
                "of its own; set scheduler.name: wsd, or unset it"
            )
        return
    if not given:
        raise ConfigError(
            "config key 'scheduler.decay_fraction': scheduler.name=wsd needs the decay's length: decay_fraction (a "
            "share of t_max) or t_decay (steps, or tokens with units: tokens)"
        )
    if len(given) == 2:
        raise ConfigError("config key 'scheduler.t_decay': set together with scheduler.decay_fraction; set one of them")
    if s.decay_fraction is not None and not 0 < s.decay_fraction <= 1:
        raise ConfigError(f"config key 'scheduler.decay_fraction': must be in (0, 1], got {s.decay_fraction}")
    steps, unit = parse_duration(cfg.max_duration)
    # the run's length in tokens is known only at start (whole steps of the batch size): checked here in steps
    t_max = s.t_max if s.t_max is not None else (int(steps) if unit == s.units == "steps" else None)
    if t_max is not None and s.t_warmup + s.decay_length(t_max) > t_max:
        raise ConfigError(
            f"config key 'scheduler.t_warmup': the warm-up ({s.t_warmup}) and the decay ({s.decay_length(t_max)}) "
            f"are longer than the schedule ({t_max} {s.units}); shorten one of them"
        )


def _check_relora(cfg: TrainConfig) -> None:
    """ReLoRA settings that contradict each other or the run are refused here, before any process starts, with the
    key and the reason (the reference implementation accepted them and trained something else than asked)."""
    r, s = cfg.relora, cfg.scheduler
    if r.rank is None:
        # cycle_length and restart_warmup_steps also shape cosine_restarts for a full-rank run
        off = ReLoRAConfig(cycle_length=r.cycle_length, restart_warmup_steps=r.restart_warmup_steps)
        for f in dataclasses.fields(ReLoRAConfig):
            if getattr(r, f.name) != getattr(off, f.name):
                raise ConfigError(
                    f"config key 'relora.{f.name}': set, but relora.rank is not; setting relora.rank turns ReLoRA on"
                )
    else:
        if r.rank < 1:
            raise ConfigError(f"config key 'relora.rank': must be positive, got {r.rank}")
        if r.alpha <= 0:
            raise ConfigError(f"config key 'relora.alpha': must be positive (the scale is alpha / rank), got {r.alpha}")
        if not 0 <= r.dropout < 1:
            raise ConfigError(f"config key 'relora.dropout': must be in [0, 1), got {r.dropout}")
        linears = [name for names in LORA_TARGETS.values() for name in names]
        for name in r.target:
            if name not in LORA_TARGETS and name not in linears:
                raise ConfigError(
                    f"config key 'relora.target': unknown linear {name!r}; expected attention, mlp or some of "
                    f"{', '.join(linears)}"
                )
        if not r.target:
            raise ConfigError("config key 'relora.target': empty; name the linears to train through adapters")
        if r.merge_every is None or r.merge_every < 1:
            raise ConfigError(
                f"config key 'relora.merge_every': {'required' if r.merge_every is None else 'must be positive'} "
                "with relora.rank (steps between merges of the adapters into the weights)"
            )
        if r.continue_from and cfg.load_path:
            raise ConfigError(
                "config key 'relora.continue_from': load_path is set too; continue_from starts a fresh run from a "
                "checkpoint's weights, load_path continues one: set one of them"
            )
    if r.prune_fraction is not None:
        if r.optimizer_reset not in ("prune", "random"):
            raise ConfigError(
                f"config key 'relora.prune_fraction': only used by optimizer_reset prune or random; "
                f"optimizer_reset {r.optimizer_reset!r} zeroes {'all' if r.optimizer_reset == 'zero' else 'none'} "
                "of the state"
            )
        if not 0 <= r.prune_fraction <= 1:
            raise ConfigError(f"config key 'relora.prune_fraction': must be in [0, 1], got {r.prune_fraction}")
    if s.name == "cosine_restarts":
        _check_restarts(cfg)


def _check_float8(cfg: TrainConfig) -> None:
    """fp8 settings that torchao cannot honour are refused here, by key, rather than deep inside the conversion (the
    device-dependent checks, torchao present, fp8 hardware, are made when the model is converted: nn/float8.py)."""
    f = cfg.float8
    if not f.enabled:
        for name in ("recipe", "fsdp_float8_all_gather", "emulate"):
            if getattr(f, name) != getattr(Float8Config(), name):
                raise ConfigError(f"config key 'float8.{name}': set, but float8.enabled is not; set float8.enabled")
        return
    if cfg.relora.rank is not None:
        raise ConfigError(
            "config key 'float8.enabled': not with relora.rank; ReLoRA's adapted linears are not converted to fp8 "
            "(their frozen weight and adapters are other modules): turn one of them off"
        )
    if f.fsdp_float8_all_gather:
        if f.recipe != "tensorwise":
            raise ConfigError(
                f"config key 'float8.fsdp_float8_all_gather': torchao gathers fp8 weights only with one scale per "
                f"tensor (recipe tensorwise), not with float8.recipe={f.recipe!r}; unset it or set it false"
            )
        if cfg.distributed_strategy != "fsdp":
            raise ConfigError(
                f"config key 'float8.fsdp_float8_all_gather': an FSDP2 feature, but distributed_strategy is "
                f"{cfg.distributed_strategy!r}; unset it or set distributed_strategy: fsdp"
            )


def _check_restarts(cfg: TrainConfig) -> None:
    r, s = cfg.relora, cfg.scheduler
    cycle = r.cycle()
    if cycle is None or cycle < 1:
        raise ConfigError(
            "config key 'relora.cycle_length': scheduler.name=cosine_restarts needs a positive cycle length "
            "(relora.cycle_length, or relora.merge_every)"
        )
    if s.units != "steps":
        raise ConfigError("config key 'scheduler.units': cosine_restarts counts its cycles in steps; set steps")
    if r.restart_warmup_steps is None or r.restart_warmup_steps < 1:
        raise ConfigError(
            "config key 'relora.restart_warmup_steps': scheduler.name=cosine_restarts needs the steps of the "
            "re-warm-up after each restart (1 or more)"
        )
    if r.restart_warmup_steps >= cycle:
        raise ConfigError(
            f"config key 'relora.restart_warmup_steps': {r.restart_warmup_steps} is not shorter than the cycle "
            f"({cycle} steps): the learning rate would never get back to the cosine envelope"
        )
    if s.t_warmup > cycle:
        raise ConfigError(
            f"config key 'scheduler.t_warmup': {s.t_warmup} is longer than a cycle ({cycle} steps): the first restart "
            "would come before the first warm-up ends"
        )
    if r.rank is not None and r.merge_every is not None and r.merge_every % cycle:
        raise ConfigError(
            f"config key 'relora.merge_every': {r.merge_every} is not a multiple of relora.cycle_length={cycle}: a "
            "merge resets the adapters' optimizer state, so it must fall on a learning-rate restart"
        )
    steps, unit = parse_duration(cfg.max_duration)
    if unit == "steps":
        check_cycles_divide(cfg, int(steps))


def check_cycles_divide(cfg: TrainConfig, total_steps: int) -> None:
    """cosine_restarts' cycles must tile the run, so that no cycle (and with merge_every equal to the cycle, no
    low-rank update) is cut short by the end of the run. Checked again at start when max_duration is in tokens or
    epochs, once the run's steps are known."""
    cycle = cfg.relora.cycle()
    if cfg.scheduler.name == "cosine_restarts" and cycle and total_steps % cycle:
        raise ConfigError(
            f"config key 'relora.cycle_length': {cycle} steps does not divide the run ({total_steps} steps, "
            f"max_duration={cfg.max_duration!r}); choose a cycle length that does, or change max_duration"
        )


def check_schedule_fits(cfg: TrainConfig, total_steps: int) -> None:
    """wsd's warm-up and decay must fit in the schedule: checked when the config is read if the run's length is in
    the schedule's units (`_check_wsd`), and at start once max_duration in tokens or epochs is a number of steps,
    else the rate would never reach its peak, or never finish decaying."""
    s = cfg.scheduler
    if s.name != "wsd" or s.t_max is not None:
        return
    t_max = total_steps * (cfg.global_train_batch_size * cfg.model.max_sequence_length if s.units == "tokens" else 1)
    if s.t_warmup + s.decay_length(t_max) > t_max:
        raise ConfigError(
            f"config key 'scheduler.t_warmup': the warm-up ({s.t_warmup}) and the decay ({s.decay_length(t_max)}) "
            f"are longer than the schedule ({t_max} {s.units}: max_duration={cfg.max_duration!r} is {total_steps} "
            "steps); shorten one of them, or lengthen the run"
        )


def parse_duration(value: int | str) -> tuple[float, str]:
    """`1000` -> (1000, "steps"); `"2e9T"` -> (2e9, "tokens"); `"1ep"` -> (1, "epochs").

    The same rule as `olmo-data stats --duration` (one parser, in olmo_data.config.duration), with the config key named.
    """
    from olmo_data.config.duration import parse_duration as parse

    try:
        return parse(value)
    except DataError as e:
        raise ConfigError(
            f"config key 'max_duration': got {shown(value)}, expected steps (1000), tokens ('2e9T') or epochs ('1ep'), "
            f"more than 0 ({e})"
        ) from e


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: TrainConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config (defaults and overrides applied) so a run can be reproduced from its
    folder."""
    from olmo_data.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
