"""Any checkpoint this project reads, as a model: ours (sharded or unsharded, trained or imported), a
`transformers` directory, OLMo's own, or the URL of one; with the tokenizer its data was made with.

`read_model_state` is the plain weights of a checkpoint of ours (a ReLoRA run's adapters merged), what export,
generation and evaluation read; `load_model` builds the model around them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.tokenizer import load_tokenizer
from olmo_train.checkpoint import (
    TOKENIZER_FILE,
    TRAINER_STATE,
    localize,
    read_config,
    read_stored_model,
    recorded_tokenizer,
)
from olmo_train.convert import olmo_core, olmo_native
from olmo_train.convert.hf import read_hf_dir
from olmo_train.convert.hf_files import CONFIG_JSON
from olmo_train.distributed import Dist
from olmo_train.nn import Transformer
from olmo_train.nn.lora import merge_state

log = logging.getLogger(__name__)


def read_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict, on CPU, keyed as `Transformer.state_dict()`: a ReLoRA
    checkpoint's weights merged, without adapters. A tied output head appears under both names, sharing one
    tensor, as `state_dict()` gives it."""
    return merge_state(read_stored_model(path))


def load_model(
    checkpoint: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[Transformer, Any]:
    """The model of a checkpoint, in eval mode, and the tokenizer its data was made with (None when it cannot
    be found; a warning says why).

    `checkpoint` is a sharded or unsharded checkpoint directory of ours, one made by `olmo-train import-hf` or
    `import-olmo`, a `transformers` model directory (config.json + safetensors), OLMo's own unsharded checkpoint
    (model.pt + config.yaml; its tokenizer is loaded when the path its config names is here), OLMo-core's step
    folder (model_and_optim/ + config.json), or the URL of a checkpoint of ours or of OLMo's.
    """
    spec = str(checkpoint)
    if not is_remote(spec) and not Path(spec).expanduser().is_dir():
        raise DataError(f"{spec}: no such checkpoint or model directory")
    if olmo_native.is_olmo_checkpoint(spec):
        model_cfg, state, olmo_config = olmo_native.read_olmo_checkpoint(spec)
        named = (olmo_config.get("tokenizer") or {}).get("identifier")
        tokenizer = _load_tokenizer(Path(str(named)), None) if named else None
    elif olmo_core.is_olmo_core_checkpoint(spec):
        model_cfg, state, core_config = olmo_core.read_olmo_core_checkpoint(spec)
        named = olmo_core.tokenizer_section(core_config).get("identifier")  # a hub id, or a tokenizer.json here
        tokenizer = _load_tokenizer(Path(named), None) if isinstance(named, str) and named.endswith(".json") else None
    else:
        path = _localize(spec) if is_remote(spec) else Path(spec).expanduser()
        if (path / CONFIG_JSON).is_file() and not (path / TRAINER_STATE).is_file():
            model_cfg, state = read_hf_dir(str(path))
            tokenizer = _load_tokenizer(path / TOKENIZER_FILE, None)
        else:
            cfg = read_config(path)
            model_cfg, state = cfg.model, read_model_state(path)
            own = path / TOKENIZER_FILE
            tokenizer = _load_tokenizer(own, None) if own.is_file() else _recorded(cfg)
    model = Transformer(model_cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DataError(
            f"{spec}: the weights do not fit the model its config describes (missing: {missing[:5]}, unexpected: "
            f"{unexpected[:5]})"
        )
    model.to(device=device, dtype=dtype).eval()
    return model, tokenizer


def _localize(url: str) -> Path:
    return localize(url, Dist(0, 1, 0, torch.device("cpu")))


def _recorded(cfg: Any) -> Any:
    identity = recorded_tokenizer(cfg)
    if identity is None:
        log.warning("no tokenizer: the run's data has no manifest naming one here; pass token ids, not text")
        return None
    return _load_tokenizer(Path(str(identity.get("path") or "")), identity.get("sha256"))


def _load_tokenizer(path: Path, sha256: str | None) -> Any:
    if not path.is_file():
        log.warning("no tokenizer: %s is not here; pass token ids, not text", path)
        return None
    tok = load_tokenizer(str(path), "hf")
    if sha256 and tok.sha256 != sha256:
        raise DataError(
            f"{path}: sha256 {tok.sha256} differs from the {sha256} the data manifest records; it is not the "
            "tokenizer the model was trained with"
        )
    return tok
