"""The files of a Hugging Face model directory: config.json, safetensors weights (one file or sharded with an
index), the tokenizer; and the hub, for a model given by its id.

Every read names the file it failed on: a truncated download is the common case, and "incomplete metadata"
from deep inside safetensors does not say which of 30 shards to fetch again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from olmo_data.errors import DataError
from olmo_data.io import usual_mode

log = logging.getLogger(__name__)

CONFIG_JSON = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
INSTALL_HINT = "pip install 'olmo-data[hf]'"

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def local_model_dir(spec: str) -> Path:
    """A local transformers model directory for `spec`: the directory itself, or a hub id downloaded where a
    network exists (offline, the hub client fails at once: no retry loop)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not _HUB_ID.fullmatch(spec):
        raise DataError(f"{spec}: no such model directory (expected {CONFIG_JSON} and safetensors weights in it)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise DataError(f"{spec}: no such directory; fetching it from the hub needs {INSTALL_HINT}") from e
    log.info("%s is not a local directory: downloading it from the Hugging Face hub", spec)
    patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns, etag_timeout=10))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(
            f"{spec}: no such directory, and the Hugging Face hub did not give it ({type(e).__name__}: {first}). "
            f"Offline? Download it where a network exists (`hf download {spec} --local-dir DIR`) and give DIR"
        ) from e


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise DataError(f"{path}: not found; a transformers model directory holds its {what} there")
    try:
        obj = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object")
    return obj


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; a truncated or corrupt one is refused by name."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise DataError(f"{path}: weights file not found")
    try:
        return load_file(str(path), device="cpu")
    except Exception as e:
        raise DataError(
            f"{path}: not a readable safetensors file ({type(e).__name__}: {e}); it is corrupt or was truncated "
            "(an interrupted download or copy?): fetch it again"
        ) from e


def read_sharded(index: Path, read_shard: Callable[[Path], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint: each shard file its index's weight_map names, read once with
    `read_shard` (safetensors, or a weights-only pytorch_model.bin), every tensor the map names checked there."""
    weight_map = read_json(index, "shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise DataError(f"{index}: no weight_map (tensor name -> shard file) in it")
    state: dict[str, torch.Tensor] = {}
    files = sorted(set(map(str, weight_map.values())))
    for n, name in enumerate(files, 1):
        log.debug("reading %s (%d of %d)", name, n, len(files))
        state.update(read_shard(index.parent / name))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise DataError(f"{index}: names tensors its shards do not hold, e.g. {missing[:4]}")
    return state


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards its index names (each read once)."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        return read_sharded(index, read_safetensors)
    if (directory / SAFETENSORS).is_file():
        log.debug("reading %s", directory / SAFETENSORS)
        return read_safetensors(directory / SAFETENSORS)
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
    hint = f" (found {others[:3]}: load and save_pretrained them with transformers first)" if others else ""
    raise DataError(
        f"{directory}: neither {SAFETENSORS} nor {SAFETENSORS_INDEX}; only safetensors weights are read{hint}"
    )


def tokenizer_vocab_size(directory: Path) -> int | None:
    """Ids the directory's tokenizer.json can produce (its vocabulary with added tokens), None without one."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return int(Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True))
    except Exception as e:
        raise DataError(f"{path}: not a readable tokenizer.json ({type(e).__name__}: {e})") from e


def write_safetensors(
    hf_state: dict[str, torch.Tensor], directory: Path, max_shard_bytes: int = 5 * 10**9
) -> list[str]:
    """The weights as model.safetensors, or as numbered shards plus the index transformers reads when they
    exceed `max_shard_bytes`; returns the file names written."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in hf_state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor.contiguous()
        size += nbytes
    if len(shards) == 1:
        names = [SAFETENSORS]
    else:
        names = [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
    for n, (name, shard) in enumerate(zip(names, shards, strict=True), 1):
        log.debug("writing %s (%d of %d, %d tensors)", name, n, len(names), len(shard))
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        usual_mode(directory / name)  # safetensors writes 0600
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in hf_state.values())
        weight_map = {key: name for name, shard in zip(names, shards, strict=True) for key in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return names


def safetensors_names(directory: Path) -> dict[str, list[int]]:
    """Tensor names and shapes in a model directory's safetensors files, from their headers only."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    out: dict[str, list[int]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    out[key] = list(f.get_slice(key).get_shape())
        except Exception as e:
            raise DataError(f"{file}: not a readable safetensors file ({type(e).__name__}: {e})") from e
    return out
