"""The training loss without the full logits: output projection, cross-entropy and z-loss, a chunk of tokens at a
time.

With a 100K vocabulary the logits of one 4096-token sequence are 1.6 GB in fp32, and autograd keeps them (and the
softmax it differentiates through) for the backward pass: the head, not the model, caps the micro-batch. Here the
tokens are cut into chunks whose logits fit a fixed budget; each chunk's projection and loss run under activation
checkpointing, so only the chunk's inputs are kept and its logits are recomputed, one chunk at a time, in backward.
The operations are the plain path's, chunk by chunk, so the loss and gradients are the same up to the order of
floating-point sums.

The z-loss (PaLM's auxiliary loss, OLMo's `softmax_auxiliary_loss`) is OLMo's: multiplier x logsumexp(logits)^2 per
supervised token, summed like the cross-entropy. It needs the same logits, so it is computed in the same chunks
(the logsumexp of a row needs the whole row, which a chunk of tokens has): still no full logits.

Per-instance losses (`token_loss_rows`): the same chunks also give each supervised token's cross-entropy, detached,
as logsumexp minus the target's logit (the z-loss needs the logsumexp anyway), and the rows' sums of them. The summed
loss that trains is still the one `F.cross_entropy` call per chunk, so it stays bitwise what it was without them; the
rows agree with it up to float rounding. Their cost is one gather per chunk (and, without z-loss, one logsumexp over
the chunk's logits, under no_grad: nothing more kept for backward).

It runs inside the model's forward (`Transformer(input_ids, labels=...)`), where FSDP2 has the output head's weight
gathered, rather than on logits returned from it.
"""

from __future__ import annotations

from collections.abc import Callable

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
    (ce,) = _chunked(_chunk_loss, hidden, weight, labels, tokens_per_chunk)
    return ce


def token_loss_sums(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    z_loss_multiplier: float,
    tokens_per_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_loss_sum`'s cross-entropy sum and, over the same supervised tokens and chunks, the z-loss sum
    z_loss_multiplier x sum(logsumexp(logits)^2). The optimized loss is their sum; they come apart so that the
    cross-entropy can be logged as it is without z-loss."""
    ce, z_squared = _chunked(_chunk_losses, hidden, weight, labels, tokens_per_chunk)
    return ce, z_loss_multiplier * z_squared


def token_loss_rows(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    z_loss_multiplier: float | None,
    tokens_per_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The cross-entropy sum, the z-loss sum (None without a multiplier), and each row's cross-entropy sum over its
    supervised tokens (float64 (B,), detached: a record, not a loss), all from the same chunks of logits.

    `hidden` is (B, T, d) and `labels` (B, T): a row is one training instance. The first two are exactly what
    `token_loss_sum` / `token_loss_sums` return for the same arguments.
    """
    if z_loss_multiplier is None:
        ce, per_token = _chunked(_chunk_loss_tokens, hidden, weight, labels, tokens_per_chunk, records=1)
        z = None
    else:
        ce, z_squared, per_token = _chunked(_chunk_losses_tokens, hidden, weight, labels, tokens_per_chunk, records=1)
        z = z_loss_multiplier * z_squared
    return ce, z, per_token.double().reshape(labels.shape).sum(-1)


def _chunked(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    tokens_per_chunk: int | None,
    records: int = 0,
) -> tuple[torch.Tensor, ...]:
    """`fn`'s sums over all tokens, computed a chunk at a time, each chunk recomputed in backward (a single chunk
    needs no recomputation: autograd keeps its logits once, as the plain path would). The last `records` outputs
    of `fn` are per-token values (detached), concatenated over the chunks instead of summed."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    step = tokens_per_chunk or chunk_tokens(weight.shape[0])
    if h.shape[0] <= step:
        return fn(h, weight, y)
    totals: tuple[torch.Tensor, ...] | None = None
    per_token: list[list[torch.Tensor]] = [[] for _ in range(records)]
    for lo in range(0, h.shape[0], step):
        out = checkpoint(fn, h[lo : lo + step], weight, y[lo : lo + step], use_reentrant=False)
        parts = out[: len(out) - records]
        for kept, part in zip(per_token, out[len(parts) :], strict=True):
            kept.append(part)
        if totals is None:
            totals = tuple(hidden.new_zeros((), dtype=torch.float32) for _ in parts)
        totals = tuple(total + part for total, part in zip(totals, parts, strict=True))
    assert totals is not None  # h has rows: the loop ran
    return totals + tuple(torch.cat(kept) for kept in per_token)


def _chunk_loss(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
    logits = F.linear(h, weight).float()
    return (F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum"),)


def _chunk_losses(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight).float()
    ce = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")
    lse = torch.logsumexp(logits, dim=-1)
    # where, not a product with the mask: a masked token's logsumexp never reaches the sum, not even as 0 * inf
    z_squared = torch.where(y != IGNORE, lse.square(), 0.0).sum()
    return ce, z_squared


def _token_ce(logits: torch.Tensor, lse: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each token's cross-entropy, logsumexp minus the target's logit, detached; 0 where the label is -100."""
    with torch.no_grad():
        target = logits.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return torch.where(y != IGNORE, lse - target, 0.0)


def _chunk_loss_tokens(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight).float()
    ce = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")  # as _chunk_loss: the same total
    with torch.no_grad():
        lse = torch.logsumexp(logits, dim=-1)
    return ce, _token_ce(logits, lse, y)


def _chunk_losses_tokens(
    h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight).float()
    ce = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")  # as _chunk_losses: the same totals
    lse = torch.logsumexp(logits, dim=-1)
    z_squared = torch.where(y != IGNORE, lse.square(), 0.0).sum()
    return ce, z_squared, _token_ce(logits, lse.detach(), y)
