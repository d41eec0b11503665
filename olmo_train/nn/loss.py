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

Per-instance losses (`token_loss_rows`, what training uses): each chunk's cross-entropy is taken per token
(`reduction="none"`), kept detached for the rows' sums, and summed into the loss. That costs nothing over the plain
sum (the same one pass over the logits; a separate logsumexp for the records measured +14% of a chunk's time on
CPU). The gradients are bitwise those of `reduction="sum"`; the summed value differs from it in the last bits of the
float32 sum only (the same terms in another order), which is why `token_loss_sum` keeps the plain reduction for
callers that want exactly the old value (evaluation).

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

    `hidden` is (B, T, d) and `labels` (B, T): a row is one training instance. The z-loss sum is exactly
    `token_loss_sums`'; the cross-entropy sum is `token_loss_sum`'s up to the order of its float32 additions, with
    bitwise the same gradients (see the module's docstring).
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


def _chunk_loss_tokens(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight).float()
    per_token = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none")  # 0 where the label is -100
    return per_token.sum(), per_token.detach()


def _chunk_losses_tokens(
    h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight).float()
    per_token = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none")
    lse = torch.logsumexp(logits, dim=-1)
    z_squared = torch.where(y != IGNORE, lse.square(), 0.0).sum()  # as _chunk_losses
    return per_token.sum(), z_squared, per_token.detach()
