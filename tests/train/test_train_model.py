"""The model's structure (causality, GQA, tying, norm placement), optimizer groups and LR schedules."""

from __future__ import annotations

import math

import pytest
import torch

from olmo_data.config import ModelConfig, OptimizerConfig, SchedulerConfig
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer, learning_rate


def tiny(**kw: object) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, n_layers=2, vocab_size=97, max_sequence_length=16)
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("norm_after", [True, False])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_causal_and_shapes(norm_after: bool, n_kv_heads: int | None) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny(norm_after=norm_after, n_kv_heads=n_kv_heads))
    ids = torch.randint(0, 97, (2, 16))
    logits = model(ids)
    assert logits.shape == (2, 16, 97)
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 97
    again = model(changed)
    assert torch.allclose(logits[:, :10], again[:, :10], atol=1e-6), "a later token changed an earlier logit"
    assert not torch.allclose(logits[:, 10:], again[:, 10:])


def test_gqa_has_fewer_kv_parameters_and_no_biases() -> None:
    full, gqa = Transformer(tiny()), Transformer(tiny(n_kv_heads=1))
    assert gqa.blocks[0].attention.w_k.weight.shape == (8, 32)
    # 2 layers x (w_k, w_v) shrink from 32x32 to 8x32, and each layer's k_norm from 32 to 8
    assert full.num_params() - gqa.num_params() == 2 * 2 * (32 * 32 - 32 * 8) + 2 * (32 - 8)
    assert all(not name.endswith("bias") for name, _ in full.named_parameters())


def test_norm_placement_differs_and_qk_norm_optional() -> None:
    torch.manual_seed(0)
    after = Transformer(tiny(norm_after=True))
    torch.manual_seed(0)
    before = Transformer(tiny(norm_after=False))
    ids = torch.randint(0, 97, (1, 16))
    assert not torch.allclose(after(ids), before(ids))  # same weights, different block wiring
    assert Transformer(tiny(attention_layer_norm=False)).blocks[0].attention.q_norm is None


def test_weight_tying_and_embedding_padding() -> None:
    model = Transformer(tiny(weight_tying=True, embedding_size=128))
    assert model.lm_head.weight is model.embeddings.weight
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 128)
    untied = Transformer(tiny(embedding_size=128))
    assert untied.num_params() - model.num_params() == 128 * 32


def test_weight_decay_groups() -> None:
    model = Transformer(tiny())
    opt = build_optimizer(model, OptimizerConfig(weight_decay=0.1))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(model.embeddings.weight) not in decayed
    assert id(model.blocks[0].attention_norm.weight) not in decayed
    assert id(model.blocks[0].mlp.w_up.weight) in decayed and id(model.lm_head.weight) in decayed
    opt = build_optimizer(model, OptimizerConfig(weight_decay=0.1, decay_embeddings=True, decay_norm_and_bias=True))
    assert len(opt.param_groups) == 1


def test_fused_adamw_takes_the_steps_of_the_foreach_path() -> None:
    """optimizer.fused (the default on GPUs) changes the kernel, not the update: equal within float rounding."""
    results = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = Transformer(tiny())
        opt = build_optimizer(model, OptimizerConfig(learning_rate=0.01, fused=fused))
        assert opt.defaults["fused"] is fused and opt.defaults["foreach"] is (not fused)
        ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            model(ids, labels=ids[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
        results[fused] = model.state_dict()
    torch.manual_seed(0)
    initial = Transformer(tiny()).state_dict()
    assert all(not torch.equal(results[True][k], initial[k]) for k in ("lm_head.weight", "blocks.0.mlp.w_up.weight"))
    for key, value in results[False].items():
        torch.testing.assert_close(results[True][key], value, rtol=1e-5, atol=1e-6)
    assert build_optimizer(Transformer(tiny()), OptimizerConfig()).defaults["fused"] is False  # CPU default


def test_schedules() -> None:
    cos = SchedulerConfig(name="cosine_with_warmup", t_warmup=10, alpha_f=0.1)
    assert learning_rate(cos, 1.0, 5, 110) == pytest.approx(0.5)
    assert learning_rate(cos, 1.0, 10, 110) == pytest.approx(1.0)
    assert learning_rate(cos, 1.0, 60, 110) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert learning_rate(cos, 1.0, 110, 110) == pytest.approx(0.1)
    assert learning_rate(cos, 1.0, 500, 110) == pytest.approx(0.1)  # past t_max: stays at the floor
    lin = SchedulerConfig(name="linear_with_warmup", t_warmup=0, alpha_f=0.0, t_max=100)
    assert learning_rate(lin, 2.0, 25, 1000) == pytest.approx(1.5)
    assert learning_rate(SchedulerConfig(name="constant"), 3.0, 7, 10) == 3.0
    warm = SchedulerConfig(name="constant_with_warmup", t_warmup=4, warmup_min_lr=0.2)
    assert learning_rate(warm, 1.0, 2, 10) == pytest.approx(0.6) and learning_rate(warm, 1.0, 8, 10) == 1.0
    tokens = SchedulerConfig(name="linear_with_warmup", units="tokens", t_warmup=1000, alpha_f=0.0)
    assert learning_rate(tokens, 1.0, 500, 10_000) == pytest.approx(0.5)


def test_flops_per_token_counts_head_and_attention() -> None:
    cfg = tiny()
    model = Transformer(cfg)
    non_embedding = model.num_params() - 97 * 32
    assert model.flops_per_token(16) == 6 * non_embedding + 12 * 2 * 32 * 16
