"""The training loss without the full logits: output projection and cross-entropy, a chunk of tokens at a time.

With a 100K vocabulary the logits of one 4096-token sequence are 1.6 GB in fp32, and autograd keeps them (and the
softmax it differentiates through) for the backward pass: the head, not the model, caps the micro-batch. Here the
tokens are cut into chunks whose logits fit a fixed budget; each chunk's projection and loss run under activation
checkpointing, so only the chunk's inputs are kept and its logits are recomputed, one chunk at a time, in backward.
The operations are the plain path's, chunk by chunk, so the loss and gradients are the same up to the order of
floating-point sums.

It runs inside the model's forward (`Transformer(input_ids, labels=...)`), where FSDP2 has the output head's weight
gathered, rather than on logits returned from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_BYTES = 128 * 2**20  # fp32 logits per chunk; the backward pass holds about three such buffers at once
IGNORE = -100


def chunk_tokens(vocab_size: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that a chunk's fp32 logits take about `budget_bytes`."""
    return max(1, budget_bytes // (4 * vocab_size))


def token_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, tokens_per_chunk: int | None = None
) -> torch.Tensor:
    """Sum over supervised tokens (labels != -100) of the cross-entropy of `hidden @ weight.T` against `labels`.

    `hidden` (..., d) are the final-norm outputs at the positions that predict `labels` (...); `weight` is the
    output head's (vocab, d). `tokens_per_chunk=None` picks it from the vocabulary size and CHUNK_BYTES.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    step = tokens_per_chunk or chunk_tokens(weight.shape[0])
    if h.shape[0] <= step:
        return _chunk_loss(h, weight, y)
    total = hidden.new_zeros((), dtype=torch.float32)
    for lo in range(0, h.shape[0], step):
        part = checkpoint(_chunk_loss, h[lo : lo + step], weight, y[lo : lo + step], use_reentrant=False)
        total = total + part
    return total


def _chunk_loss(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = F.linear(h, weight).float()
    return F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")
