"""Per-instance losses from the chunked loss: the training step is bitwise the one without them (same gradients,
same z-loss; the cross-entropy sum to float32 rounding), and each row's sum is the cross-entropy of that row,
computed here on full logits by `F.cross_entropy`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer, token_loss_rows, token_loss_sum, token_loss_sums


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(4, 30, 16, generator=g)
    weight = torch.randn(211, 16, generator=g).mul_(0.3)
    labels = torch.randint(0, 211, (4, 30), generator=g)
    labels[0, :11] = -100  # a prompt: not trained
    labels[3] = -100  # an instance the instance filter masked: no supervised token at all
    return hidden, weight, labels


def full_logits_rows(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return per_token.double().sum(-1)


@pytest.mark.parametrize("per_chunk", [1, 7, 30, 1000])
@pytest.mark.parametrize("multiplier", [None, 1e-3])
def test_rows_match_full_logits_and_the_gradients_are_bitwise_unchanged(
    per_chunk: int, multiplier: float | None
) -> None:
    hidden, weight, labels = inputs()
    h1 = hidden.clone().requires_grad_(True)
    ce, z, rows = token_loss_rows(h1, weight, labels, multiplier, per_chunk)
    h2 = hidden.clone().requires_grad_(True)
    if multiplier is None:
        assert z is None
        ref_ce = token_loss_sum(h2, weight, labels, per_chunk)
        ref_total = ref_ce
        total = ce
    else:
        assert z is not None
        ref_ce, ref_z = token_loss_sums(h2, weight, labels, multiplier, per_chunk)
        assert torch.equal(z, ref_z)
        ref_total, total = ref_ce + ref_z, ce + z
    torch.testing.assert_close(ce, ref_ce, rtol=1e-6, atol=0.0)  # the same terms, summed in another order
    total.backward()
    ref_total.backward()
    assert h1.grad is not None and h2.grad is not None and torch.equal(h1.grad, h2.grad)  # the same training step
    assert not rows.requires_grad and rows.dtype == torch.float64 and rows.shape == (4,)
    torch.testing.assert_close(rows, full_logits_rows(hidden, weight, labels), rtol=1e-5, atol=1e-5)
    assert rows[3] == 0
    torch.testing.assert_close(rows.sum(), ce.double(), rtol=1e-5, atol=1e-4)


def test_the_model_forward_gives_rows_with_its_loss() -> None:
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=97, max_sequence_length=24, loss_chunk_tokens=10)
    torch.manual_seed(0)
    net = Transformer(cfg)
    ids = torch.randint(0, 97, (3, 24))
    labels = ids[:, 1:].clone()
    labels[1, :5] = -100
    ce, z, rows = net(ids, labels=labels, instance_losses=True)
    assert z is None
    torch.testing.assert_close(ce, net(ids, labels=labels), rtol=1e-6, atol=0.0)
    with torch.no_grad():
        logits = net(ids)[:, :-1]
    expected = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none").double().sum(-1)
    torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-5)
