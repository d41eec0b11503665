"""Where does a converted model stop computing what ours computes? Block by block, against `transformers`.

A conversion that maps one tensor wrongly still loads, and its logits are merely bad; from logits alone nobody can
tell which of 32 layers is at fault. Here both models run the same token ids with a forward hook on each block, and
the first place where their activations part (embedding, block i, final norm, logits) is named. Both run in fp32,
whatever dtype the weights were written in, so only the mapping is tested, not the rounding of an export.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from olmo_data.config import ModelConfig
from olmo_data.errors import DataError
from olmo_train.convert.hf_files import INSTALL_HINT
from olmo_train.nn import Transformer
from olmo_train.optional import quietly

log = logging.getLogger(__name__)


def load_transformers_model(directory: Path, *, loading_info: bool = False, float32: bool = True) -> Any:
    """`AutoModelForCausalLM.from_pretrained(directory)` in eval mode, cast to fp32 unless `float32` is False
    (checking names and shapes needs no cast, which would double a bf16 export's memory), with its loading info
    if asked."""
    try:
        with quietly():
            from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise DataError(f"loading {directory} with transformers needs it installed: {INSTALL_HINT}") from e
    try:
        with quietly():  # transformers imports torchao (when installed) on its first load
            loaded: Any = AutoModelForCausalLM.from_pretrained(str(directory), output_loading_info=loading_info)
    except Exception as e:
        raise DataError(f"{directory}: transformers cannot load this model ({type(e).__name__}: {e})") from e
    model, info = loaded if loading_info else (loaded, None)
    model = (model.to(torch.float32) if float32 else model).eval()
    return (model, info) if loading_info else model


def probe_ids(model: ModelConfig, batch: int = 2, length: int = 24, seed: int = 0) -> torch.Tensor:
    """A few token ids spread over the whole vocabulary, the same on every call."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.vocab_size, (batch, min(length, model.max_sequence_length)), generator=g)


def _record(modules: list[tuple[str, nn.Module]], into: dict[str, torch.Tensor]) -> list[Any]:
    def hook(name: str) -> Callable[..., None]:
        def save(module: nn.Module, args: Any, output: Any) -> None:
            into[name] = (output[0] if isinstance(output, tuple) else output).detach().float()

        return save

    return [module.register_forward_hook(hook(name)) for name, module in modules]


@torch.no_grad()
def compare_with_transformers(
    hf_model: Any,
    model: ModelConfig,
    state: dict[str, torch.Tensor],
    *,
    token_ids: torch.Tensor | None = None,
    tolerance: float = 1e-4,
) -> float:
    """Run ours (from `state`) and the transformers model (a loaded one, or a directory) on the same ids; raise a
    DataError naming the first stage whose output differs by more than `tolerance` (relative to the
    activations' scale); return the largest absolute logit difference when all agree."""
    if isinstance(hf_model, (str, Path)):
        hf_model = load_transformers_model(Path(hf_model))
    ours = Transformer(model)
    ours.load_state_dict({k: v.float() for k, v in state.items()})
    ours.eval()
    ids = probe_ids(model) if token_ids is None else token_ids
    theirs_inner = hf_model.model
    stages = ["embedding", *(f"block {i}" for i in range(model.n_layers)), "final norm"]
    our_modules = [ours.embeddings, *ours.blocks, ours.norm]
    their_modules = [theirs_inner.embed_tokens, *theirs_inner.layers, theirs_inner.norm]
    if len(their_modules) != len(our_modules):
        raise DataError(f"the transformers model has {len(theirs_inner.layers)} layers, ours {model.n_layers}")
    got: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    handles = _record(list(zip(stages, our_modules, strict=True)), got)
    handles += _record(list(zip(stages, their_modules, strict=True)), expected)
    try:
        got["logits"] = ours(ids).float()
        expected["logits"] = hf_model(input_ids=ids).logits.float()
    finally:
        for h in handles:
            h.remove()
    for stage in [*stages, "logits"]:
        a, b = got[stage], expected[stage]
        if a.shape != b.shape:
            raise DataError(f"{stage}: output shape {list(a.shape)} here, {list(b.shape)} in transformers")
        diff = float((a - b).abs().max())
        scale = max(1.0, float(b.abs().max()))
        log.debug("%s: max abs difference %.3g (scale %.3g)", stage, diff, scale)
        if diff > tolerance * scale:
            where = {"embedding": "the embedding", "final norm": "the final norm", "logits": "the output head"}
            raise DataError(
                f"the converted model first differs at {stage}: max abs difference {diff:.3g} (activations up to "
                f"{scale:.3g}, tolerance {tolerance:g} relative); the tensors of {where.get(stage, stage)} are "
                "mapped or written wrongly"
            )
    return float((got["logits"] - expected["logits"]).abs().max())
