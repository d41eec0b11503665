"""Document masking on packed chat data: conversations are kept apart where `prepare-tulu` recorded them, not at
EOS (which also ends every assistant turn), so a packed instance trains each conversation as if it were alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from olmo_data import chat
from olmo_data.config import ModelConfig
from olmo_data.dataset.instances import open_dataset
from olmo_data.errors import DataError
from olmo_train.nn import Transformer, doc_ids_from_eos
from olmo_train.train import DocumentStarts, labels_for, main
from olmo_train.train.loop import forward_loss_sum

REPO = Path(__file__).resolve().parents[2]
SEQ = 160
EOS = 0  # the demo tokenizer's <|endoftext|>


def conversations(path: Path, n: int = 14) -> Path:
    """Multi-turn conversations of varied lengths: every one has an EOS inside it (after its first reply)."""
    with path.open("w") as f:
        for i in range(n):
            messages = [{"role": "user", "content": f"What is {i} plus {i}?"}]
            messages.append({"role": "assistant", "content": f"It is {2 * i}." + " Indeed." * (i % 4)})
            messages.append({"role": "user", "content": "And times two?" + " Please." * (i % 3)})
            messages.append({"role": "assistant", "content": f"That makes {4 * i}."})
            f.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")
    return path


def prepared(tmp_path: Path, tokenizer: str, template: str, pack: bool) -> Path:
    out = tmp_path / f"{template}-{'packed' if pack else 'alone'}"
    source = conversations(tmp_path / "tulu.jsonl")
    chat.prepare_chat([str(source)], out, chat.ChatOptions(tokenizer, seq_len=SEQ, template=template, pack=pack))
    return out


def net(**kw: Any) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=2048, max_sequence_length=SEQ, **kw)
    return Transformer(cfg).eval()


def whole_set(directory: Path) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
    source = open_dataset([str(directory)], sequence_length=SEQ)
    indices = np.arange(len(source))
    ids, masks = source.get_batch(indices)
    assert masks is not None
    starts = DocumentStarts(source, EOS).rows(indices, ids)
    return ids, torch.from_numpy(ids), labels_for(torch.from_numpy(ids), torch.from_numpy(masks)), starts


@pytest.mark.parametrize(("template", "attention"), [("olmo", "mask"), ("tulu", "mask"), ("olmo", "flex")])
def test_the_packed_chat_loss_is_the_sum_of_its_conversations_alone(
    tmp_path: Path, demo_tokenizer: str, template: str, attention: str
) -> None:
    packed_dir = prepared(tmp_path, demo_tokenizer, template, pack=True)
    alone_dir = prepared(tmp_path, demo_tokenizer, template, pack=False)
    raw, ids, labels, starts = whole_set(packed_dir)
    _, alone_ids, alone_labels, _ = whole_set(alone_dir)
    assert len(ids) < len(alone_ids) and int(starts.sum()) > len(ids)  # packing did put several in an instance
    spans = chat.read_doc_boundaries(str(packed_dir))
    expected = np.zeros_like(starts)
    for start, end in spans.tolist():  # each conversation starts a document, and so does the padding after the last
        for cut in (start, end):
            if cut < raw.size:
                expected.flat[cut] = True
    expected[:, 0] = True
    np.testing.assert_array_equal(starts, expected)
    flat = raw.reshape(-1)
    assert all((flat[s + 1 : e - 1] == EOS).any() for s, e in spans.tolist()), "a reply's EOS inside each conversation"

    model = net(document_masking=True, document_positions=True, document_attention=attention)
    with torch.no_grad():
        packed_loss = forward_loss_sum(model, ids, labels, torch.from_numpy(starts))
        alone_loss = forward_loss_sum(model, alone_ids, alone_labels)  # one conversation per row: plain attention
        at_eos = model(ids, labels=labels, doc_ids=doc_ids_from_eos(ids, EOS))
        plain = model(ids, labels=labels)
    assert int((labels != -100).sum()) == int((alone_labels != -100).sum())
    torch.testing.assert_close(packed_loss, alone_loss, rtol=1e-6, atol=1e-4)
    assert abs(float(at_eos - alone_loss)) > 1e-2, "cutting at EOS splits replies from their prompts: it must differ"
    assert abs(float(plain - alone_loss)) > 1e-2


def test_a_damaged_or_missing_boundary_file_is_refused_by_name(tmp_path: Path, demo_tokenizer: str) -> None:
    directory = prepared(tmp_path, demo_tokenizer, "olmo", pack=True)
    bounds = directory / chat.BOUNDARIES
    source = open_dataset([str(directory)], sequence_length=SEQ)
    good = bounds.read_bytes()
    bounds.write_bytes(good[:-8])
    with pytest.raises(DataError, match=rf"{bounds}: {len(good) - 8} bytes, but .*manifest.json counts"):
        DocumentStarts(source, EOS)
    spans = np.frombuffer(good, dtype="<u8").copy()
    spans[-1] = 10**9
    bounds.write_bytes(spans.tobytes())
    with pytest.raises(DataError, match=rf"{bounds}: spans outside the"):
        DocumentStarts(source, EOS)
    bounds.unlink()
    with pytest.raises(DataError, match=rf"{bounds}: cannot read the conversation boundaries"):
        DocumentStarts(source, EOS)
    manifest = json.loads((directory / "manifest.json").read_text())
    del manifest["doc_boundaries"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"without doc_boundaries in its manifest"):
        DocumentStarts(open_dataset([str(directory)], sequence_length=SEQ), EOS)


def test_fine_tuning_packed_chat_with_document_masking(tmp_path: Path, demo_tokenizer: str) -> None:
    """Through the trainer: the EOS comes from the chat manifest, and the step-1 loss equals the loss of the batch's
    conversations computed alone with the initial weights."""
    packed_dir = prepared(tmp_path, demo_tokenizer, "tulu", pack=True)
    alone_dir = prepared(tmp_path, demo_tokenizer, "tulu", pack=False)
    n = len(open_dataset([str(packed_dir)], sequence_length=SEQ))
    model = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "vocab_size": 2048}
    model |= {"max_sequence_length": SEQ, "document_masking": True, "document_positions": True}
    config = {
        "seed": 5,
        "save_folder": str(tmp_path / "run"),
        "max_duration": 1,
        "global_train_batch_size": n,  # the whole set in step 1: its conversations are all of alone_dir's
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": None,
        "model": model,
        "data": {"paths": [str(packed_dir)]},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main([str(path)]) == 0
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["eos_token_id"] == EOS
    assert saved["optimizer"]["fused"] is False  # resolved (foreach on CPU) and recorded, so a resume keeps it
    torch.manual_seed(5)  # the trainer's initial weights (build_model)
    initial = Transformer(ModelConfig(**model))
    _, alone_ids, alone_labels, _ = whole_set(alone_dir)
    with torch.no_grad():
        expected = float(initial(alone_ids, labels=alone_labels)) / int((alone_labels != -100).sum())
    assert record["train/supervised_tokens"] == int((alone_labels != -100).sum())
    assert record["train/loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_document_masking_under_fsdp_trains_as_one_process(tmp_path: Path, demo_tokenizer: str) -> None:
    """Each rank finds the conversation boundaries of its own rows: 2 FSDP processes (with activation
    checkpointing) give the losses of one process."""
    packed_dir = prepared(tmp_path, demo_tokenizer, "olmo", pack=True)
    model = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "vocab_size": 2048}
    model |= {"max_sequence_length": SEQ, "document_masking": True, "document_positions": True}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    losses = {}
    for name, launcher in (
        ("fsdp", ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]),
        ("single", []),
    ):
        config = {
            "seed": 5,
            "save_folder": str(tmp_path / name),
            "max_duration": 3,
            "global_train_batch_size": 4,
            "device_train_microbatch_size": 1,
            "distributed_strategy": "fsdp" if launcher else "single",
            "save_interval": None,
            "optimizer": {"learning_rate": 0.01},
            "model": model | {"activation_checkpointing": bool(launcher)},
            "data": {"paths": [str(packed_dir)]},
        }
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        command = [sys.executable, *launcher, "-m", "olmo_train", str(tmp_path / f"{name}.yaml")]
        proc = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        metrics = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [json.loads(line)["train/loss"] for line in metrics]
    assert len(losses["fsdp"]) == 3 and losses["fsdp"] == pytest.approx(losses["single"], rel=1e-5)


FLEX_UNDER_FSDP = """
import os, sys, torch
from torch.distributed.fsdp import fully_shard
from olmo_data.config import ModelConfig
from olmo_train.nn import doc_ids_from_eos
from olmo_train.nn import Transformer
torch.distributed.init_process_group("gloo")
cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=97, max_sequence_length=64,
                  document_masking=True, document_positions=True)
out = {}
for attention in ("mask", "flex"):
    torch.manual_seed(0)
    cfg.document_attention = attention
    net = Transformer(cfg)
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    ids = torch.randint(1, 97, (2, 64), generator=torch.Generator().manual_seed(1))
    ids[:, [9, 30, 41]] = 0
    with torch.no_grad():
        out[attention] = net(ids, doc_ids=doc_ids_from_eos(ids, 0))
torch.testing.assert_close(out["flex"], out["mask"], rtol=0, atol=1e-5)
os.write(1, f"equal {torch.distributed.get_rank()}\\n".encode())  # one write: the two ranks' lines never interleave
"""


@pytest.mark.slow
def test_a_flex_block_mask_passes_through_fsdp_blocks(tmp_path: Path) -> None:
    """FSDP2's hooks hand the FlexAttention block mask to every sharded block intact (forward only: torch has no
    FlexAttention backward on CPU, so training with flex is for GPUs, where `auto` picks it)."""
    script = tmp_path / "flex_fsdp.py"
    script.write_text(FLEX_UNDER_FSDP)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split()) == ["0", "1", "equal", "equal"]


def test_flex_is_refused_for_training_off_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, 64, 8 * 32).astype(np.uint16).tofile(tokens)
    model = {"d_model": 32, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": 32}
    model |= {"document_masking": True, "eos_token_id": 0, "document_attention": "flex"}
    config = {"save_folder": str(tmp_path / "run"), "max_duration": 1, "global_train_batch_size": 2}
    config |= {"distributed_strategy": "single", "model": model, "data": {"paths": [str(tokens)]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main([str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "config key 'model.document_attention': flex cannot train on cpu" in err
    assert not (tmp_path / "run").exists()
