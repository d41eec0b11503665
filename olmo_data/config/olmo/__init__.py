"""OLMo's training YAML (the `allenai/OLMo` trainer's, as in its `configs/official-*/OLMo2-*.yaml`) read as this
project's config. `load_config` hands a file in OLMo's form to `translate` before it builds the dataclasses.
Modules: `model_keys` (the model section, shared with `convert/olmo_native.py`), `values` (interpolation, numbers as
YAML 1.1 reads them), `translate` (every other key). It is a package of its own, not a module of `convert/`,
because `config.py` imports it: it must not import torch, nor `convert/` (which imports `config.py`).

Why a translator rather than OLMo's names in our schema: most keys already have OLMo's names; the others either
mean the same thing under another name (`data.memmap_dtype` is `data.dtype`, `softmax_auxiliary_loss` is
`z_loss_multiplier`), mean something else under the same name (OLMo's `model.mlp_hidden_size` is the fused width,
twice ours), or concern OLMo's own machinery (dataloader workers, FSDP wrapping, its garbage collector). Keeping
them out of the schema keeps one form for a saved config.yaml: what actually ran.

How OLMo's form is recognised (`olmo_form_key`): the file has a key that OLMo's TrainConfig has and ours does not
(`dry_run`, `fsdp`, `tokenizer`, `model.rope`, `data.memmap_dtype`, ...). A config of ours never has one (a key
of neither is refused as unknown), so a run's saved config.yaml reads back as ours.

A file in OLMo's form is read as OLMo reads it: command-line overrides use OLMo's names and apply before
`${key}` / `${a.b}` interpolations are resolved (so an interpolation follows an overridden value); a key the
file leaves out takes OLMo's default, not ours (for the model those are GPT-2's, refused by key where this model
differs); then each key is honoured (mapped onto ours), refused by name when its value asks for something this
trainer does not do, or, when it only concerns OLMo's infrastructure, accepted and named in one log line.
Numbers that YAML 1.1 reads as strings (`1e-5`, `5e12`) become numbers where our field is numeric.
"""

from olmo_data.config.olmo.model_keys import (
    IGNORED,
    MODEL_KEYS,
    OLMO_DEFAULTS,
    REQUIRED,
    as_kind,
    model_values_from_olmo,
)
from olmo_data.config.olmo.translate import Translation, olmo_form_key, translate
from olmo_data.config.olmo.values import resolve_interpolations

__all__ = [
    "IGNORED",
    "MODEL_KEYS",
    "OLMO_DEFAULTS",
    "REQUIRED",
    "Translation",
    "as_kind",
    "model_values_from_olmo",
    "olmo_form_key",
    "resolve_interpolations",
    "translate",
]
