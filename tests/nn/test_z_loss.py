"""The z-loss computed in the chunked loss is OLMo's: multiplier x logsumexp(logits)^2 over the supervised tokens.

The reference below is OLMo's published rule (ai2-olmo's `olmo.train.cross_entropy_loss(..., compute_z_loss=True)`),
written out on full logits: `z_squared = logits.logsumexp(-1).pow(2)`, times the label mask (labels != -100), summed
(reduction "sum") or averaged over every position (reduction "mean"), times the multiplier.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer, doc_ids_from_eos, token_loss_sum, token_loss_sums


def olmo_losses(
    logits: torch.Tensor, labels: torch.Tensor, multiplier: float, reduction: str = "sum"
) -> tuple[torch.Tensor, torch.Tensor]:
    """OLMo's cross_entropy_loss with compute_z_loss=True, by its definition, on (N, V) logits and (N,) labels."""
    ce = F.cross_entropy(logits, labels, ignore_index=-100, reduction=reduction)
    z_squared = logits.logsumexp(-1).pow(2) * (labels != -100)
    return ce, multiplier * (z_squared.sum() if reduction == "sum" else z_squared.mean())


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 50, 16, generator=g)
    weight = torch.randn(301, 16, generator=g).mul_(0.3)
    labels = torch.randint(0, 301, (3, 50), generator=g)
    labels[0, :20] = -100  # unsupervised tokens (prompts, padding, filtered instances) count nowhere
    labels[2] = -100
    return hidden, weight, labels


@pytest.mark.parametrize("per_chunk", [1, 7, 64, 1000])
def test_chunked_z_loss_equals_the_full_logits_rule_in_value_and_gradient(per_chunk: int) -> None:
    hidden, weight, labels = inputs()
    multiplier = 1e-2
    results = []
    for chunked in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            ce, z = token_loss_sums(h, w, labels, multiplier, per_chunk)
        else:
            logits = F.linear(h, w).float()
            ce, z = olmo_losses(logits.reshape(-1, 301), labels.reshape(-1), multiplier)
        z_grads = torch.autograd.grad(z, (h, w), retain_graph=True)  # the z-loss's own gradient
        (ce + z).backward()  # and the optimized loss's
        results.append([ce.detach(), z.detach(), *z_grads, h.grad, w.grad])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert float(results[0][2].abs().sum()) > 0
    assert float(results[0][2][2].abs().sum()) == 0  # a fully masked row gets no gradient from the z-loss


def test_z_loss_off_leaves_the_cross_entropy_bitwise_unchanged() -> None:
    hidden, weight, labels = inputs()
    for per_chunk in (7, 1000):
        ce, _ = token_loss_sums(hidden, weight, labels, 1e-4, per_chunk)
        assert torch.equal(ce, token_loss_sum(hidden, weight, labels, per_chunk))


def test_an_untrained_models_z_loss_is_multiplier_times_ln_embedding_size_squared() -> None:
    """Near-uniform logits at init: logsumexp = ln(E) for the E rows of the output head (the padded embedding size,
    not the vocabulary: the padding rows are in the softmax too). The trainer divides by the supervised tokens, so
    its z-loss is multiplier x ln(E)^2; OLMo's "mean" reduction averages over every position, so it is that times
    the share of supervised labels."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=100, embedding_size=256, max_sequence_length=64)
    net = Transformer(cfg)
    ids = torch.randint(0, 100, (4, 64))
    labels = ids[:, 1:].clone()
    labels[:, :21] = -100  # a third of the labels are masked
    supervised = int((labels != -100).sum())
    share = supervised / labels.numel()
    multiplier = 1e-4
    with torch.no_grad():
        ce, z = net(ids, labels=labels, z_loss_multiplier=multiplier)
        logits = net(ids)[:, :-1]
    expected = multiplier * math.log(256) ** 2
    assert float(z) / supervised == pytest.approx(expected, rel=5e-3)
    assert float(z) / supervised != pytest.approx(multiplier * math.log(100) ** 2, rel=5e-2)
    ce_mean, z_mean = olmo_losses(logits.reshape(-1, 256), labels.reshape(-1), multiplier, reduction="mean")
    assert float(z_mean) == pytest.approx(expected * share, rel=5e-3)
    assert float(z) / labels.numel() == pytest.approx(float(z_mean), rel=1e-5)  # the same number, normalized apart
    assert float(ce) / supervised == pytest.approx(float(ce_mean), rel=1e-5)


def test_chunked_z_loss_with_document_masking_equals_the_full_logits_rule() -> None:
    """Inside the model, with packed documents: chunks of 5 tokens (uneven) give the full logits' numbers, and the
    same gradients for every weight."""
    ids = torch.randint(1, 97, (2, 48), generator=torch.Generator().manual_seed(1))
    ids[0, [9, 30]] = 0  # EOS: three documents in row 0
    labels = ids[:, 1:].clone()
    labels[0, 10] = -100
    doc_ids = doc_ids_from_eos(ids, 0)
    results = []
    for chunk in (5, None):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=97, max_sequence_length=64)
        cfg.document_masking = True
        net = Transformer(cfg)
        if chunk is not None:
            net.cfg.loss_chunk_tokens = chunk
            ce, z = net(ids, labels=labels, doc_ids=doc_ids, z_loss_multiplier=1e-2)
        else:
            logits = net(ids, doc_ids=doc_ids)[:, :-1]
            ce, z = olmo_losses(logits.reshape(-1, 97).float(), labels.reshape(-1), 1e-2)
        ((ce + z) / int((labels != -100).sum())).backward()  # per supervised token, as the trainer divides
        results.append([ce.detach(), z.detach(), *(p.grad for p in net.parameters())])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
