"""ai2-olmo's own Hugging Face format (`model_type: hf_olmo`: DataDecide and the other checkpoints its `hf_olmo`
package wrote) as models of ours, without ai2-olmo: `import-hf` of such a directory, and `load_model` on it.

Such a directory is OLMo's native checkpoint in transformers' files: config.json holds OLMo's own `model:` keys
at its top level (ai2-olmo's `OLMoConfig` is its `ModelConfig.asdict()`, every key present, beside transformers'
bookkeeping), and the weights are OLMo's state dict under `model.` (its `OLMoForCausalLM` wraps the `OLMo`
module as `.model`), with the fused `att_proj` and `ff_proj`, in safetensors or pytorch_model.bin. So the config
is read by OLMo's key table (olmo_data/config/olmo/model_keys.py, with its refusals by key: clip_qkv, ALiBi,
biases, the llama block, scaled logits, ...) and the weights by olmo_native's tensor table; nothing here is a
second copy of either. An import is then a model of ours like any other, and export-hf writes it as the
transformers type that computes the same function (`olmo` for OLMo-1's block, `olmo2` for OLMo-2's), which
transformers loads without ai2-olmo.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import torch

from olmo_data.config import ModelConfig
from olmo_data.errors import DataError
from olmo_train.convert.hf_files import (
    CONFIG_JSON,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    local_model_dir,
    read_hf_weights,
    read_json,
    read_sharded,
    tokenizer_vocab_size,
)
from olmo_train.convert.olmo_native import OLMO_TENSORS, model_config_from_olmo, plain_olmo_name
from olmo_train.convert.tables import to_our_state

log = logging.getLogger(__name__)

HF_OLMO = "hf_olmo"
BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
PREFIX = "model."  # OLMoForCausalLM's attribute holding the OLMo module

# What transformers' PretrainedConfig writes into every config.json beside the model's own keys: bookkeeping that
# hf_olmo's model never reads (it builds OLMo from OLMo's keys alone; `tie_word_embeddings` is not read either:
# its tie_weights is a no-op and `weight_tying` decides). Any other key OLMo does not have is refused by name.
TRANSFORMERS_KEYS = frozenset(
    {
        "architectures",
        "auto_map",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "_name_or_path",
        "_attn_implementation",
        "_attn_implementation_autoset",  # written by some transformers 4.4x releases
        "bos_token_id",
        "tie_word_embeddings",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
    }
)


def is_hf_olmo(hf_cfg: dict[str, Any]) -> bool:
    """Whether a config.json is ai2-olmo's hf_olmo format (transformers itself has no such model type)."""
    return hf_cfg.get("model_type") == HF_OLMO


def model_config_from_hf_olmo(hf_cfg: dict[str, Any], source: str = CONFIG_JSON) -> ModelConfig:
    """Our ModelConfig for an hf_olmo config.json, refusing by key any option that would make OLMo's model compute
    something ours does not. A key the file leaves out takes ai2-olmo's default, as its OLMoConfig does."""
    section = {k: v for k, v in hf_cfg.items() if k not in TRANSFORMERS_KEYS}
    return model_config_from_olmo(section, source, prefix="")


def read_hf_olmo(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict for an hf_olmo model directory (or hub id). The config is read and checked
    before any weights are, and a tokenizer.json with ids past the embedding is refused."""
    directory = local_model_dir(str(path))
    config_path = directory / CONFIG_JSON
    hf_cfg = read_json(config_path, "config")
    if not is_hf_olmo(hf_cfg):
        raise DataError(f"{config_path}: model_type is {hf_cfg.get('model_type')!r}, not {HF_OLMO!r}")
    model = model_config_from_hf_olmo(hf_cfg, str(config_path))
    rows = model.embedding_size or model.vocab_size
    vocab = tokenizer_vocab_size(directory)
    if vocab is not None and vocab > rows:
        raise DataError(
            f"{directory / 'tokenizer.json'}: {vocab} tokens, but the model's embedding has {rows} rows "
            f"({CONFIG_JSON} embedding_size); ids past {rows - 1} would have no embedding"
        )
    weights, where = _read_weights(directory)
    group = hf_cfg.get("block_group_size") or 1
    olmo_state: dict[str, torch.Tensor] = {}
    for key in list(weights):
        if not key.startswith(PREFIX):
            raise DataError(f"{where}: tensor {key} is not under {PREFIX!r}; not the weights of an hf_olmo model")
        olmo_state[plain_olmo_name(key[len(PREFIX) :], group)] = weights.pop(key)
    return model, to_our_state(OLMO_TENSORS, olmo_state, model, "hf_olmo", where)


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The directory's tensors, and the file (or index) to name in errors: safetensors when present, else
    transformers' older pytorch_model.bin (one file or sharded), read as plain tensors only (never unpickled
    as arbitrary objects: such a file from the hub is untrusted)."""
    if (directory / SAFETENSORS_INDEX).is_file() or (directory / SAFETENSORS).is_file():
        index = directory / SAFETENSORS_INDEX
        return read_hf_weights(directory), str(index if index.is_file() else directory / SAFETENSORS)
    index = directory / BIN_INDEX
    if index.is_file():
        return read_sharded(index, _read_bin), str(index)
    if (directory / BIN).is_file():
        return _read_bin(directory / BIN), str(directory / BIN)
    raise DataError(f"{directory}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {BIN} or {BIN_INDEX})")


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    """One pytorch_model.bin: weights_only, so that only tensors and plain containers are unpickled (anything
    else, code included, is refused by torch), mmap so that the tensors are read as they are used."""
    if not path.is_file():
        raise DataError(f"{path}: weights file not found")
    log.debug("reading %s", path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:  # torch's own text advises weights_only=False: not what to do here
        lines = [line for line in str(e).splitlines() if "GLOBAL" in line or "Unsupported" in line]
        refused = f" ({lines[0].strip()})" if lines else ""
        raise DataError(
            f"{path}: holds objects other than tensors{refused}; it is not unpickled (that would run code the file "
            "names): convert it to safetensors from a copy you trust"
        ) from e
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise DataError(f"{path}: cannot be read as a state dict of tensors ({type(e).__name__}: {first})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"{path}: expected a dict of tensors (a model state dict)")
    return {str(k): v for k, v in state.items()}
