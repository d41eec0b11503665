"""A training run's config, read one way for the trainer and for every data command.

`schema` (the dataclasses, their defaults and comments), `load` (YAML and `--key=value` overrides into a checked
`TrainConfig`; `read_run_config` for a path, a dict or a config), `checks` (values checked by meaning),
`duration` (max_duration in steps), `keys` (`--keys`), and `olmo/` (OLMo's own YAML form translated into ours;
part of the API, as `convert/olmo_native` reads OLMo's model keys through it). It lives in the data library,
below the trainer, so `inspect-batch`, `trace`, `stats`, `build-order`, `lineage` and `spikes` see the config
the trainer trains on: the same defaults, the same OLMo keys, the same interpolation. Torch-free, like the rest
of `olmo_data`.
"""

from olmo_data.config import olmo
from olmo_data.config.duration import duration_steps
from olmo_data.config.keys import keys_text
from olmo_data.config.load import (
    check_cycles_divide,
    check_schedule_fits,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_duration,
    read_run_config,
    save_config,
)
from olmo_data.config.olmo_core_form import is_olmo_core_form, olmo_core_form
from olmo_data.config.schema import (
    CHOICES,
    LORA_TARGETS,
    ConfigError,
    DataConfig,
    EvaluatorConfig,
    EvaluatorDataConfig,
    Float8Config,
    InstanceFilterConfig,
    ModelConfig,
    OptimizerConfig,
    ReLoRAConfig,
    RopeConfig,
    RopeScalingConfig,
    SchedulerConfig,
    SlidingWindowConfig,
    TokenizerConfig,
    TrainConfig,
    WandbConfig,
    YaRNScalingConfig,
)

__all__ = [
    "CHOICES",
    "LORA_TARGETS",
    "ConfigError",
    "DataConfig",
    "EvaluatorConfig",
    "EvaluatorDataConfig",
    "Float8Config",
    "InstanceFilterConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ReLoRAConfig",
    "RopeConfig",
    "RopeScalingConfig",
    "SchedulerConfig",
    "SlidingWindowConfig",
    "TokenizerConfig",
    "TrainConfig",
    "WandbConfig",
    "YaRNScalingConfig",
    "check_cycles_divide",
    "check_schedule_fits",
    "config_from_dict",
    "config_to_dict",
    "duration_steps",
    "is_olmo_core_form",
    "keys_text",
    "load_config",
    "olmo",
    "olmo_core_form",
    "parse_duration",
    "read_run_config",
    "save_config",
]
