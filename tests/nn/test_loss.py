"""The chunked loss equals the plain one (logits of the whole micro-batch, then cross-entropy), gradients included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from olmo_train.nn import chunk_tokens, token_loss_sum


def plain(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum")


@pytest.mark.parametrize("per_chunk", [1, 7, 64, 1000])
def test_loss_and_gradients_equal_the_plain_path(per_chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 50, 16, generator=g, dtype=torch.float64).float()
    weight = torch.randn(301, 16, generator=g).mul_(0.1)
    labels = torch.randint(0, 301, (3, 50), generator=g)
    labels[0, :20] = -100  # unsupervised tokens (prompts, padding) count nowhere
    labels[2] = -100
    got, want = [], []
    for fn, out in (
        (lambda h, w: token_loss_sum(h, w, labels, per_chunk), got),
        (lambda h, w: plain(h, w, labels), want),
    ):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = fn(h, w)
        loss.backward()
        out.extend([loss.detach(), h.grad, w.grad])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # fp32 sums in another order: a few ulps
    assert float(got[2].abs().sum()) > 0


def test_chunk_size_keeps_the_logits_within_the_budget() -> None:
    assert chunk_tokens(100_352) == 128 * 2**20 // (4 * 100_352) == 334
    assert chunk_tokens(10**12) == 1
