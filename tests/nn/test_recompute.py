"""Activation checkpointing keeps the plain run's gradients and stores less: selective between none and full."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer


class OpCounts(TorchDispatchMode):
    """How many times each aten op ran."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def run(ac: bool, policy: str = "full") -> tuple[dict[str, torch.Tensor], Counter[str]]:
    """Gradients of one loss, and the ops that forward and backward ran."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=64,
        n_heads=4,
        n_layers=3,
        vocab_size=101,
        max_sequence_length=64,
        activation_checkpointing=ac,
        activation_checkpointing_policy=policy,
    )
    net = Transformer(cfg).train()
    ids = torch.randint(0, 101, (4, 64), generator=torch.Generator().manual_seed(1))
    with OpCounts() as ops:
        net(ids, labels=ids[:, 1:]).backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    return grads, ops.counts


def test_selective_recomputes_the_cheap_ops_and_no_matmul() -> None:
    """Both policies give the plain run's gradients; full recomputes the blocks' matmuls in backward, selective only
    what lies between them (its saved matmul and attention outputs are what it trades memory for)."""
    plain, plain_ops = run(False)
    full, full_ops = run(True, "full")
    selective, selective_ops = run(True, "selective")
    for name, grad in plain.items():
        torch.testing.assert_close(full[name], grad, rtol=0, atol=1e-7)
        torch.testing.assert_close(selective[name], grad, rtol=0, atol=1e-7)
    blocks_mm = 7 * 3  # q, k, v, out, gate, up, down in each of 3 blocks
    assert full_ops["mm"] == plain_ops["mm"] + blocks_mm
    assert selective_ops["mm"] == plain_ops["mm"]
    assert selective_ops["silu"] == full_ops["silu"] == plain_ops["silu"] + 3
    assert selective_ops["_fused_rms_norm"] + selective_ops["rsqrt"] > plain_ops["_fused_rms_norm"] + plain_ops["rsqrt"]


def test_the_policy_is_checked_by_key() -> None:
    from olmo_data.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.activation_checkpointing_policy"):
        load_config(None, ["--data.paths=[x]", "--model.activation_checkpointing_policy=some"])
    for key, switch in (
        ("model.activation_checkpointing_policy=selective", "model.activation_checkpointing"),
        ("model.document_attention=flex", "model.document_masking"),
        ("model.document_positions=true", "model.document_masking"),
    ):
        with pytest.raises(ConfigError, match=rf"'{key.partition('=')[0]}': set, but {switch} is not"):
            load_config(None, ["--data.paths=[x]", f"--{key}"])
        load_config(None, ["--data.paths=[x]", f"--{key}", f"--{switch}=true"])
