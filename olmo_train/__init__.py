"""olmo_train: a compact trainer for OLMo-style models that reads its data only through `olmo_data`.

Packages by concept (ARCHITECTURE.md maps every module): `nn` (the model and what runs in its forward),
`train` (the loop, its data, optimizer, metrics, ReLoRA), `checkpoint` (saving, loading, checking; one `layout`
names every file), `convert` (Hugging Face and OLMo formats, unsharding, a model from any checkpoint). Beside
them: `config` (dataclasses and overrides), `config_keys` (`--keys`), `distributed` (process group and
FSDP/DDP), `generate` (text from a model). `python -m olmo_train` enters through `__main__`.
"""

from olmo_train.optional import quiet

__all__ = ["quiet"]
