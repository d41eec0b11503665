"""`compile: true` compiles each block whole: no graph breaks with any of the training options a block sees (plain
causal attention, the document mask with per-document positions, FlexAttention's block mask, activation
checkpointing around it). Dynamo decides the graph breaks before any backend runs, so `torch._dynamo.explain`
checks on CPU what `TORCH_LOGS=graph_breaks` would show on a GPU; the fp8 case is in tests/nn/test_float8.py."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch._dynamo

from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer, attention_mask, doc_ids_from_eos, document_positions, token_loss_sum

T = 64


def setup(**kw: object) -> tuple[Transformer, torch.Tensor]:
    torch.manual_seed(0)
    base: dict[str, object] = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "vocab_size": 97}
    cfg = ModelConfig(**(base | {"max_sequence_length": T} | kw))  # type: ignore[arg-type]
    ids = torch.randint(1, 97, (2, T), generator=torch.Generator().manual_seed(1))
    ids[:, [9, 30, 41]] = 0
    return Transformer(cfg), ids


CASES = ["plain", "mask", "mask+positions", "flex", "flex+positions", "plain+full", "mask+selective"]


@pytest.mark.parametrize("case", CASES)
def test_a_block_compiles_without_graph_breaks(case: str) -> None:
    recompute = case.rpartition("+")[2] if case.endswith(("full", "selective")) else None
    if recompute:
        net, ids = setup(activation_checkpointing=True, activation_checkpointing_policy=recompute)
    else:
        net, ids = setup()
    x = net.embeddings(ids)
    cos, sin, mask = net.rope_cos[:T], net.rope_sin[:T], None
    if not case.startswith("plain"):
        doc_ids = doc_ids_from_eos(ids, 0)
        mask = attention_mask(doc_ids, flex=case.startswith("flex"))
        if "positions" in case:
            positions = document_positions(doc_ids)
            cos, sin = net.rope_cos[positions].unsqueeze(1), net.rope_sin[positions].unsqueeze(1)
    torch._dynamo.reset()
    # torch has no FlexAttention backward on CPU (training with flex is for GPUs): trace its forward only
    with torch.no_grad() if case.startswith("flex") else contextlib.nullcontext():
        explained = torch._dynamo.explain(net.blocks[0])(x, cos, sin, mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_the_chunked_loss_compiles_without_graph_breaks() -> None:
    """The output head and loss, chunked under activation checkpointing, trace as one graph too."""
    net, ids = setup()
    hidden = net.norm(net.embeddings(ids))[:, :-1]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(token_loss_sum)(hidden, net.lm_head.weight, ids[:, 1:], 16)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_explain_does_see_a_graph_break() -> None:
    """The check above can fail: a block that reads a tensor's value into Python breaks its graph."""
    net, ids = setup()
    x = net.embeddings(ids)

    def breaking(x: torch.Tensor) -> torch.Tensor:
        y = net.blocks[0](x, net.rope_cos[:T], net.rope_sin[:T])
        return y * float(y.sum())

    torch._dynamo.reset()
    assert torch._dynamo.explain(breaking)(x).graph_break_count >= 1


def backward_matmuls(**kw: object) -> int:
    """Matrix multiplications in the compiled backward graph of one block (AOTAutograd's partition, as inductor
    gets it): 2 per linear for the gradients, plus those recomputed."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    counts: list[int] = []

    def backward(gm: torch.fx.GraphModule, example: object) -> object:
        counts.append(sum(n.op == "call_function" and "mm" in str(n.target) for n in gm.graph.nodes))
        return make_boxed_func(gm)

    net, ids = setup(n_layers=1, **kw)
    torch._dynamo.reset()
    net.blocks[0].compile(backend=aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=backward))
    net.train()(ids, labels=ids[:, 1:]).backward()
    assert len(counts) == 1
    return counts[0]


def test_the_checkpoint_policy_holds_inside_a_compiled_block() -> None:
    """compile: true with activation checkpointing compiles the checkpoint with the block, so the policy decides
    what the compiled backward recomputes: full recomputes the block's 7 matmuls, selective none of them."""
    plain = backward_matmuls()
    assert plain == 2 * 7
    assert backward_matmuls(activation_checkpointing=True, activation_checkpointing_policy="full") == plain + 7
    assert backward_matmuls(activation_checkpointing=True, activation_checkpointing_policy="selective") == plain
