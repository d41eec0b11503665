"""Conversions between this project's checkpoints and other formats, and a model from any of them.

Modules: `tables` (format-neutral name and config-field tables, read both ways), `hf` (Hugging Face
`transformers`: tables, config.json), `hf_files` (safetensors and config files), `hf_convert` (export-hf,
import-hf), `hf_check` (block-by-block comparison with `transformers`), `olmo_native` (OLMo's own checkpoints:
import-olmo), `olmo_core` and `olmo_core_config` (OLMo-core's checkpoints and run config: import-olmo-core),
`unshard` (a sharded checkpoint as an unsharded one), `load` (`load_model` and `read_model_state` for any
checkpoint).
"""

from olmo_train.convert.hf import expected_hf_names, from_hf_state, hf_config, read_hf_dir, to_hf_state
from olmo_train.convert.hf_check import compare_with_transformers
from olmo_train.convert.hf_convert import export_hf, import_hf
from olmo_train.convert.load import load_model, read_model_state
from olmo_train.convert.olmo_core import import_olmo_core, is_olmo_core_checkpoint, read_olmo_core_checkpoint
from olmo_train.convert.olmo_native import import_olmo, is_olmo_checkpoint, read_olmo_checkpoint
from olmo_train.convert.tables import ConfigField, Fused, TensorTable, to_our_state, to_their_state
from olmo_train.convert.unshard import unshard

__all__ = [
    "ConfigField",
    "Fused",
    "TensorTable",
    "compare_with_transformers",
    "expected_hf_names",
    "export_hf",
    "from_hf_state",
    "hf_config",
    "import_hf",
    "import_olmo",
    "import_olmo_core",
    "is_olmo_checkpoint",
    "is_olmo_core_checkpoint",
    "load_model",
    "read_hf_dir",
    "read_model_state",
    "read_olmo_checkpoint",
    "read_olmo_core_checkpoint",
    "to_hf_state",
    "to_our_state",
    "to_their_state",
    "unshard",
]
