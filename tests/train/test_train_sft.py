"""Supervised fine-tuning: label masks decide which tokens train, and the loss is the hand-computed mean over
exactly those tokens of the whole global batch, whatever the micro-batch split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from olmo_data import chat
from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer
from olmo_train.train import main

F = torch.nn.functional

SEQ = 32


def write_config(path: Path, **cfg: Any) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def model_cfg(vocab: int) -> dict[str, Any]:
    return {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": vocab, "max_sequence_length": SEQ}


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def hand_loss(weights: dict[str, Any], vocab: int, ids: np.ndarray, mask: np.ndarray) -> tuple[float, int]:
    """Mean next-token cross-entropy over the targets whose label mask is True, over the whole batch."""
    model = Transformer(ModelConfig(**model_cfg(vocab)))
    model.load_state_dict(weights)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids))[:, :-1].double()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    targets = torch.from_numpy(ids[:, 1:])
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    keep = torch.from_numpy(mask[:, 1:])
    return float(-(picked[keep]).sum() / keep.sum()), int(keep.sum())


def base_model(tmp_path: Path, vocab: int) -> Path:
    """A few steps of pre-training on random tokens; returns the run folder (step2 and step2-unsharded)."""
    tokens = tmp_path / "pretrain.npy"
    np.random.default_rng(1).integers(0, vocab, 40 * SEQ).astype(np.uint16).tofile(tokens)
    config = write_config(
        tmp_path / "base.yaml",
        save_folder=str(tmp_path / "base"),
        max_duration=2,
        global_train_batch_size=4,
        device_train_microbatch_size=4,
        distributed_strategy="single",
        save_interval=2,
        save_interval_unsharded=2,
        model=model_cfg(vocab),
        optimizer={"learning_rate": 0.01},
        data={"paths": [str(tokens)]},
    )
    assert main([str(config)]) == 0
    return tmp_path / "base"


def test_label_mask_paths_loss_equals_hand_computation(tmp_path: Path) -> None:
    vocab = 64
    base = base_model(tmp_path, vocab)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, vocab, 12 * SEQ).astype(np.uint16)
    mask = rng.random(12 * SEQ) < 0.3  # uneven counts per instance: a per-micro-batch mean would differ
    ids.tofile(tmp_path / "sft.npy")
    mask.tofile(tmp_path / "sft_mask.npy")
    config = write_config(
        tmp_path / "sft.yaml",
        save_folder=str(tmp_path / "sft"),
        load_path=str(base / "step2"),
        reset_trainer_state=True,
        max_duration=2,
        global_train_batch_size=4,
        device_train_microbatch_size=1,
        distributed_strategy="single",
        model=model_cfg(vocab),
        data={"paths": [str(tmp_path / "sft.npy")], "label_mask_paths": [str(tmp_path / "sft_mask.npy")]},
    )
    assert main([str(config)]) == 0
    from olmo_data.run.batches import inspect_batch

    batch = inspect_batch(str(config), step=1)
    got_ids = np.array([inst.token_ids for inst in batch.instances])
    got_mask = np.array([inst.label_mask for inst in batch.instances])
    weights = torch.load(base / "step2-unsharded" / "model.pt", weights_only=True)
    expected, count = hand_loss(weights, vocab, got_ids, got_mask)
    first = metrics(tmp_path / "sft")[0]
    assert first["step"] == 1 and first["train/supervised_tokens"] == count
    assert first["train/loss"] == pytest.approx(expected, rel=1e-5)
    unmasked, _ = hand_loss(weights, vocab, got_ids, np.ones_like(got_mask))
    assert abs(unmasked - expected) > 1e-3  # the mask changes the loss: the check above can fail


def test_finetune_on_prepare_tulu_output(tmp_path: Path, demo_tokenizer: str) -> None:
    from olmo_data.run.batches import inspect_batch
    from olmo_data.tokenizer import load_tokenizer

    conversations = tmp_path / "tulu.jsonl"
    with conversations.open("w") as f:
        for i in range(10):
            messages = [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"The sum is {2 * i}."},
            ]
            f.write(json.dumps({"id": f"ex{i}", "messages": messages}) + "\n")
    chat.prepare_chat([str(conversations)], tmp_path / "chat", chat.ChatOptions(demo_tokenizer, seq_len=SEQ))
    vocab = 2048
    base = base_model(tmp_path, vocab)
    config = write_config(
        tmp_path / "sft.yaml",
        save_folder=str(tmp_path / "sft"),
        load_path=str(base / "step2"),
        reset_trainer_state=True,
        max_duration=3,
        global_train_batch_size=4,
        device_train_microbatch_size=1,
        distributed_strategy="single",
        model=model_cfg(vocab),
        optimizer={"learning_rate": 0.003},
        data={"paths": [str(tmp_path / "chat")]},
    )
    assert main([str(config)]) == 0
    got = metrics(tmp_path / "sft")
    assert [r["step"] for r in got] == [1, 2, 3], "reset_trainer_state starts a fresh run at step 1"
    assert [r["train/tokens_seen"] for r in got] == [s * 4 * SEQ for s in (1, 2, 3)]
    state = json.loads((tmp_path / "sft" / "latest" / "trainer_state.json").read_text())
    assert state["step"] == 3
    batch = inspect_batch(str(config), step=1)
    ids = np.array([inst.token_ids for inst in batch.instances])
    mask = np.array([inst.label_mask for inst in batch.instances])
    tok = load_tokenizer(demo_tokenizer)
    for row_ids, row_mask in zip(ids, mask, strict=True):  # only the assistant's answer (and EOS) is trained
        trained = tok.decode([int(t) for t in row_ids[row_mask] if t != 0])
        answers = [f"The sum is {2 * i}." for i in range(10)]  # (truncated at SEQ tokens: a prefix of one)
        assert trained and any(a.startswith(trained) for a in answers), trained
    weights = torch.load(base / "step2-unsharded" / "model.pt", weights_only=True)
    expected, count = hand_loss(weights, vocab, ids, mask)
    assert got[0]["train/supervised_tokens"] == count
    assert got[0]["train/loss"] == pytest.approx(expected, rel=1e-5)
