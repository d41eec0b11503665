"""Attention windows: the blocked attention equals a dense masked one, OLMo-core's own rules (its layer pattern, its
window as flash-attn's (w - 1, 0), its YaRN) agree with ours, and a windowed model trains with document masking."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from olmo_data.config import ConfigError, ModelConfig, RopeScalingConfig, SlidingWindowConfig, config_from_dict
from olmo_train.generate import KVCache, generate
from olmo_train.nn import Transformer, doc_ids_from_eos
from olmo_train.nn import windows as windows_module
from olmo_train.nn.rope import attention_factor, inverse_frequencies
from olmo_train.nn.windows import window_attention


def dense_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, extra: torch.Tensor | None) -> torch.Tensor:
    """The reference: one SDPA call with the whole (T, S) band mask."""
    T, S = q.shape[2], k.shape[2]
    qi = torch.arange(S - T, S)[:, None]
    kj = torch.arange(S)[None, :]
    mask = (kj <= qi) & (kj > qi - w)
    if extra is not None:
        mask = mask & extra
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("w", [1, 3, 7, 50])
@pytest.mark.parametrize("block", [1, 4, 64])
def test_blocked_window_attention_equals_the_dense_band(w: int, block: int) -> None:
    g = torch.Generator().manual_seed(w * 100 + block)
    B, H, Hkv, T, D = 2, 4, 2, 23, 8
    q, k, v = (torch.randn(B, h, T, D, generator=g) for h in (H, Hkv, Hkv))
    got = window_attention(q, k, v, w, block=block)
    torch.testing.assert_close(got, dense_window(q, k, v, w, None), rtol=1e-5, atol=1e-6)
    # documents: a token sees its own document's tokens within its window
    doc = doc_ids_from_eos(torch.randint(0, 5, (B, T), generator=g), 0)
    same = (doc[:, :, None] == doc[:, None, :]).unsqueeze(1)
    got = window_attention(q, k, v, w, doc_ids=doc, block=block)
    torch.testing.assert_close(got, dense_window(q, k, v, w, same), rtol=1e-5, atol=1e-6)
    # queries after cached keys, with a padding rule over more keys than are kept (generation)
    keys = torch.randn(B, Hkv, T + 9, D, generator=g)
    pad = torch.ones(B, 1, 5, T + 12, dtype=torch.bool)
    pad[0, ..., :6] = False  # row 0's first tokens are padding
    got = window_attention(q[:, :, -5:], keys, keys, w, mask=pad, block=block)
    torch.testing.assert_close(got, dense_window(q[:, :, -5:], keys, keys, w, pad[..., 3:]), rtol=1e-5, atol=1e-6)


def olmo_core_window(pattern: list[int], first: bool, last: bool, n: int) -> list[int | None]:
    from olmo_core.nn.attention import SlidingWindowAttentionConfig

    cfg = SlidingWindowAttentionConfig(pattern, first, last)
    return [cfg.get_window_size(i, n) if cfg.should_use_swa(i, n) else None for i in range(n)]


@pytest.mark.parametrize("pattern", [[4096, 4096, 4096, -1], [8, -1], [5], [3, 7, -1]])
@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_layer_windows_follow_olmo_cores_rule(pattern: list[int], first: bool, last: bool) -> None:
    pytest.importorskip("olmo_core")
    for n in (1, 2, 5, 8, 32):
        model = ModelConfig(n_layers=n, sliding_window=SlidingWindowConfig(pattern, first, last))
        assert model.attention_windows() == olmo_core_window(pattern, first, last, n), (pattern, first, last, n)


def test_transformers_layer_types_form_and_bad_windows() -> None:
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    model = ModelConfig(n_layers=3, sliding_window=16, layer_types=types)
    assert model.attention_windows() == [16, None, 16]
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "int without types": ({"sliding_window": 16}, r"'model.sliding_window': a window of 16 tokens needs"),
        "types without window": ({"layer_types": types}, r"must be a window of 1 or more tokens, got None"),
        "wrong count": ({"layer_types": types[:2], "sliding_window": 4}, r"2 entries for 3 layers"),
        "unknown type": ({"layer_types": ["x", *types[1:]], "sliding_window": 4}, r"layer_types': got 'x'"),
        "both forms": (
            {"layer_types": types, "sliding_window": {"pattern": [4]}},
            r"'model.layer_types': set with OLMo-core's model.sliding_window.pattern",
        ),
        "zero in pattern": ({"sliding_window": {"pattern": [4, 0]}}, r"pattern': got \[4, 0\]; expected window sizes"),
        "typo": ({"sliding_window": {"patern": [4]}}, r"did you mean 'model.sliding_window.pattern'"),
        "two yarns": (
            {"rope_scaling": {"factor": 2}, "rope": {"scaling": {"factor": 2}}},
            r"'model.rope.scaling': set together with model.rope_scaling",
        ),
        "linear rope": ({"rope_scaling": {"rope_type": "linear"}}, r"rope_type': got 'linear'; only yarn"),
        "shrinking": ({"rope": {"scaling": {"factor": 0.5}}}, r"'model.rope.scaling.factor': must be 1 or more"),
    }
    for name, (keys, match) in bad.items():
        with pytest.raises(ConfigError, match=match):
            config_from_dict({"model": {"n_layers": 3, **keys}, "data": {"paths": ["x"]}})
        print("refused:", name)


def test_yarn_frequencies_equal_olmo_cores() -> None:
    """OLMo-core's YaRN (its `rope: {scaling: ...}` form) and ours give the same frequencies at OLMo 3's sizes."""
    pytest.importorskip("olmo_core")
    from olmo_core.nn.rope import YaRNRoPEScalingConfig

    for head_dim, theta, factor, context in ((128, 500_000, 8.0, 8192), (16, 10_000, 4.0, 16)):
        theirs, factor_theirs = YaRNRoPEScalingConfig(factor, 32, 1, context).compute_scaled_inv_freq(
            theta, head_dim, torch.device("cpu")
        )
        cfg = config_from_dict(
            {"model": {"rope": {"scaling": {"factor": factor, "old_context_len": context}}}, "data": {"paths": ["x"]}}
        )
        yarn = cfg.model.yarn()
        assert yarn == RopeScalingConfig("yarn", factor, context, 32.0, 1.0)
        torch.testing.assert_close(inverse_frequencies(head_dim, theta, yarn), theirs.float(), rtol=1e-6, atol=0)
        assert attention_factor(yarn) == pytest.approx(factor_theirs)


def test_olmo_cores_window_is_ours() -> None:
    """OLMo-core's attention with window_size w (flash-attn's (w - 1, 0); its torch backend's band mask on CPU)
    computes what our windowed layer computes with the same weights."""
    pytest.importorskip("olmo_core")
    from olmo_core.nn.attention import Attention as CoreAttention
    from olmo_core.nn.layer_norm import LayerNormConfig
    from olmo_core.nn.rope import RoPEConfig

    w, T = 5, 19
    cfg = ModelConfig(
        d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=64, max_sequence_length=T, init_std=0.3
    )
    cfg.sliding_window = SlidingWindowConfig([w], False, True)
    ours = Transformer(cfg).eval()
    theirs = CoreAttention(
        d_model=32, n_heads=4, n_kv_heads=2, rope=RoPEConfig(theta=int(cfg.rope_theta)),
        qk_norm=LayerNormConfig(name="rms", eps=cfg.layer_norm_eps, bias=False), window_size=w, bias=False,
    ).eval()  # fmt: skip
    missing = theirs.load_state_dict(ours.blocks[0].attention.state_dict(), strict=True)
    assert not missing.missing_keys
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        want = theirs(x)
        got = ours.blocks[0].attention(x, ours.rope_cos[:T], ours.rope_sin[:T])
        wider = Transformer(ModelConfig(**{**cfg.__dict__, "sliding_window": SlidingWindowConfig([w + 1], False)}))
        wider.load_state_dict(ours.state_dict())
        other = wider.blocks[0].attention(x, ours.rope_cos[:T], ours.rope_sin[:T])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (other - want).abs().max() > 1e-3  # a window one token wider is another function


def windowed(**overrides: Any) -> ModelConfig:
    base: dict[str, Any] = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 3, "vocab_size": 50}
    return ModelConfig(
        **{**base, "max_sequence_length": 64, "init_std": 0.3, "sliding_window": SlidingWindowConfig([4, -1], False)}
        | overrides
    )


def test_training_loss_with_windows_and_documents_is_each_documents_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed documents under windows: each row's loss is the sum of its documents' losses computed alone, through
    several query blocks; and the gradients flow (a training step on CPU)."""
    monkeypatch.setattr(windows_module, "query_block", lambda window: 3)
    torch.manual_seed(0)
    cfg = windowed(document_masking=True, document_positions=True, eos_token_id=0)
    model = Transformer(cfg)
    ids = torch.randint(1, 50, (2, 30))
    ids[0, [7, 20]] = 0
    ids[1, 12] = 0
    doc = doc_ids_from_eos(ids, 0)
    labels = ids[:, 1:]
    total, _, rows = model(ids, labels=labels, doc_ids=doc, instance_losses=True)
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with torch.no_grad():
        for r in range(2):
            want = 0.0
            for d in doc[r].unique():
                span = (doc[r] == d).nonzero().flatten()
                a, b = int(span[0]), int(span[-1]) + 1
                logits = model(ids[r : r + 1, a:b])[0]
                end = min(b, ids.shape[1] - 1)  # the last token of the row has no target
                want += float(F.cross_entropy(logits[: end - a], ids[r, a + 1 : end + 1], reduction="sum"))
            assert float(rows[r]) == pytest.approx(want, rel=1e-5)


def test_generation_with_a_windowed_cache_equals_recomputing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy decoding far past the window, through the cache's compactions (SLACK made small), gives what
    recomputing the whole sequence each step gives; padded rows give what they give alone; beams run."""
    monkeypatch.setattr(KVCache, "SLACK", 3)
    torch.manual_seed(1)
    model = Transformer(windowed()).eval()
    cache = KVCache(model, 1, 40, torch.float32, torch.device("cpu"))
    assert [layer.k.shape[2] for layer in cache.layers] == [3 + 3, 40, 40]  # w - 1 + SLACK for the windowed one
    prompts = [[5, 9, 13, 2, 7, 7, 30], [11, 3]]
    out = generate(model, prompts, 25)
    for row, prompt in enumerate(prompts):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(25):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert out.token_ids[row, 0].tolist() == seq[len(prompt) :]
    beams = generate(model, prompts, 12, beam_size=3)
    assert beams.token_ids.shape == (2, 3, 12) and bool((beams.scores[:, :-1] >= beams.scores[:, 1:]).all())


def test_flex_window_mask_equals_the_blocked_path() -> None:
    """FlexAttention's window block mask (the GPU path with document masking) computes what the blocked SDPA path
    computes; on CPU flex runs unfused, forward only, which is enough to compare."""
    torch.manual_seed(2)
    cfg = windowed(document_masking=True, eos_token_id=0, document_attention="mask")
    model = Transformer(cfg).eval()
    flex = Transformer(windowed(document_masking=True, eos_token_id=0, document_attention="flex")).eval()
    flex.load_state_dict(model.state_dict())
    ids = torch.randint(1, 50, (2, 40))
    ids[0, [11, 25]] = 0
    doc = doc_ids_from_eos(ids, 0)
    with torch.no_grad():
        torch.testing.assert_close(flex(ids, doc_ids=doc), model(ids, doc_ids=doc), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pattern", [[4, -1], [-1]])
def test_long_rows_attend_one_document_at_a_time(monkeypatch: pytest.MonkeyPatch, pattern: list[int]) -> None:
    """From SEGMENT_TOKENS a row, documents are attended one by one (no T x T mask for the full layers either):
    the same logits and gradients as the masks give."""
    torch.manual_seed(3)
    model = Transformer(windowed(document_masking=True, eos_token_id=0, sliding_window=SlidingWindowConfig(pattern)))
    ids = torch.randint(1, 50, (2, 40))
    ids[0, [11, 25]] = 0
    ids[1, 3] = 0
    doc = doc_ids_from_eos(ids, 0)
    results = []
    for limit in (10**9, 16):  # masks, then documents one at a time
        monkeypatch.setattr(windows_module, "SEGMENT_TOKENS", limit)
        model.zero_grad()
        loss = model(ids, labels=ids[:, 1:], doc_ids=doc)
        loss.backward()
        results.append((float(loss), [p.grad.clone() for p in model.parameters()]))
    (a, grads_a), (b, grads_b) = results
    assert b == pytest.approx(a, rel=1e-6)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=2e-5)
