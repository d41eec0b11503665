"""Activation checkpointing: what a block keeps for its backward pass and what it computes again.

`model.activation_checkpointing: true` runs each block under `torch.utils.checkpoint`: with the policy `full`, a
block keeps only its inputs and recomputes everything in backward (the least memory, one more forward of compute).
With `selective`, it keeps the outputs of its matrix multiplications and of attention, the expensive operations,
and recomputes only the cheap ones between them (norms, rotary embeddings, SiLU, products), whose saved outputs take
much of a block's activation memory: most of full's saving in compute, part of its saving in memory. Either way
the gradients are those of the plain run: only what is stored changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_aten = torch.ops.aten
SAVED_OPS = {
    _aten.mm.default,
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.higher_order.flex_attention,  # document masking on GPUs
}
FLASH_ATTN_FORWARD = "flash_attn._flash_attn_forward"  # flash-attn >= 2.6 registers its forward as a torch op


def _keep_expensive(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    keep = op in SAVED_OPS or str(op).startswith(FLASH_ATTN_FORWARD)
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def _selective() -> Any:
    return create_selective_checkpoint_contexts(_keep_expensive)


def checkpointed(block: Callable[..., torch.Tensor], policy: str, *args: Any) -> torch.Tensor:
    """`block(*args)` under activation checkpointing with `policy` (full | selective)."""
    if policy == "selective":
        return checkpoint(block, *args, use_reentrant=False, context_fn=_selective)  # type: ignore[no-any-return]
    return checkpoint(block, *args, use_reentrant=False)  # type: ignore[no-any-return]
