"""LoRA adapters on the block linears: the module, and the arithmetic that merges a state dict's adapters.

The adapters are a small module of our own rather than `peft`'s, for three reasons. It keeps the base weight under
its own name (`blocks.0.attention.w_q.weight`), so checkpoints, `export-hf`'s tables and a plain model's state dict
all keep their keys, and the adapters add only `lora_A`, `lora_B` and `lora_scale` beside it. Its parameters are
plain parameters of a plain module, so FSDP2 shards them with the rest of their block (one `fully_shard` per
block, as for full-rank training) and DCP saves and reshards them like any other. And every random number it draws
comes from a generator seeded by (seed, merge, adapter), never from the global RNG, so a re-initialised `A` is the
same whatever the world size and whether or not the run was resumed in between: that is what makes a resume
across a merge bitwise.

Whatever reads a checkpoint's weights outside the trainer gets them merged (`split_state`, `merge_state`): the
ReLoRA regime that trains these adapters is `olmo_train.train.relora`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from olmo_data.config import LORA_TARGETS, ReLoRAConfig, TrainConfig
from olmo_train.distributed import unwrap

ADAPTER_KEYS = ("lora_A", "lora_B", "lora_scale")


class LoRALinear(nn.Module):
    """y = x Wᵀ + scale · (dropout(x) Aᵀ) Bᵀ, W frozen. A starts Kaiming-uniform (as nn.Linear's weight) and B at
    zero: the update B·A is zero at first, and B gets a gradient on the first step (A from the second, once B is
    no longer zero). Were both zero, neither would ever get a gradient (the reference implementation's issue 18)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, generator: torch.Generator) -> None:
        super().__init__()
        if base.bias is not None:
            raise ValueError("LoRALinear wraps bias-free linears (the model has no biases)")
        self.weight: nn.Parameter = base.weight
        self.weight.requires_grad_(False)
        self.lora_A: nn.Parameter = nn.Parameter(kaiming_uniform((rank, base.in_features), generator))
        self.lora_B: nn.Parameter = nn.Parameter(torch.zeros(base.out_features, rank))
        self.lora_scale: torch.Tensor
        self.register_buffer("lora_scale", torch.tensor(alpha / rank))  # in the state dict: merges need it
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return F.linear(x, self.weight) + update * self.lora_scale.to(update.dtype)

    def extra_repr(self) -> str:
        out, rank = self.lora_B.shape
        return f"in={self.lora_A.shape[1]}, out={out}, rank={rank}, scale={float(self.lora_scale):g}"


def kaiming_uniform(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """nn.Linear's default init (bound 1/sqrt(fan_in)), drawn from `generator`."""
    return nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)


def seeded(*key: int) -> torch.Generator:
    """A CPU generator for one purpose: (seed, merge, adapter, ...) -> an independent stream."""
    state = np.random.SeedSequence([k & 0xFFFFFFFF for k in key]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def target_names(cfg: ReLoRAConfig) -> list[str]:
    """The block linears (attribute names inside `attention` / `mlp`) that get adapters, in block order."""
    wanted = {n for t in cfg.target for n in LORA_TARGETS.get(t, (t,))}
    return [n for names in LORA_TARGETS.values() for n in names if n in wanted]


def add_adapters(model: nn.Module, cfg: TrainConfig) -> None:
    """Replace the targeted linears of every block by LoRALinear (nothing when relora.rank is not set). Call on the
    freshly initialised model, before it is sharded or replicated; the base weights stay those of the full-rank
    model of the same seed, and embeddings, norms and the output head keep training in full rank."""
    r = cfg.relora
    if r.rank is None:
        return
    index = 0
    for block in model.blocks:  # type: ignore[union-attr]
        for name in target_names(r):
            parent = block.attention if hasattr(block.attention, name) else block.mlp
            base = getattr(parent, name)
            setattr(parent, name, LoRALinear(base, r.rank, r.alpha, r.dropout, seeded(cfg.seed, 0, index)))
            index += 1


def adapters(model: nn.Module) -> list[LoRALinear]:
    """The model's adapters, in a fixed order (the same on every rank and world size)."""
    return [m for m in unwrap(model).modules() if isinstance(m, LoRALinear)]


def is_adapter_key(key: str) -> bool:
    return key.rpartition(".")[2] in ADAPTER_KEYS


def split_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A full (unsharded) model state dict -> (the plain merged weights, keyed as a model without adapters; the
    exact state of the adapted linears: their unmerged weight, A, B and scale). Without adapters: (state, {})."""
    prefixes = [k[: -len(".lora_A")] for k in state if k.endswith(".lora_A")]
    exact = {f"{p}.{n}": state[f"{p}.{n}"] for p in prefixes for n in ("weight", *ADAPTER_KEYS)}
    plain = {k: v for k, v in state.items() if not is_adapter_key(k)}
    for p in prefixes:
        plain[f"{p}.weight"] = state[f"{p}.weight"] + update(
            state[f"{p}.lora_B"], state[f"{p}.lora_A"], state[f"{p}.lora_scale"]
        )
    return plain, exact


def merge_state(state: dict[str, Any]) -> dict[str, Any]:
    """The plain merged weights of a full model state dict (the state dict itself when it has no adapters)."""
    return split_state(state)[0]


def update(b: torch.Tensor, a: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """scale·B·A: what a merge adds to W, by the one expression that merges in training and merges of a state
    dict (export, unshard) share, so that both give the same bits (on the same kind of device)."""
    return (b @ a) * scale
