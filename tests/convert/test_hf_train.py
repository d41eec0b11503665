"""Through the trainer: the loss the trainer logs at step k+1 is the `transformers` loss of the exported step-k
checkpoint on that step's batch, and a `transformers` model imported with `import-hf` fine-tunes on
`prepare-tulu` output from exactly its own weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data import chat
from olmo_data.run.batches import inspect_batch
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SEQ = 64


def train(config: Path, *overrides: str) -> None:
    """`python -m olmo_train CONFIG ...` in one process, as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "olmo_train", str(config), *overrides],
        cwd=REPO,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def batch_of(config: Path, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and label mask (all True for plain token data) of a step's global batch, from inspect-batch."""
    batch = inspect_batch(str(config), step=step)
    ids = np.array([inst.token_ids for inst in batch.instances], dtype=np.int64)
    masks = [inst.label_mask if inst.label_mask is not None else np.ones(len(ids[0]), bool) for inst in batch.instances]
    return torch.from_numpy(ids), torch.from_numpy(np.array(masks, dtype=bool))


@torch.no_grad()
def transformers_loss(hf_dir: Path, ids: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """Mean next-token cross-entropy over the targets the label mask keeps, with the transformers model."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    logits = hf(input_ids=ids).logits[:, :-1].double()
    labels = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
    count = int((labels != -100).sum())
    return float(total) / count, count


@pytest.mark.slow
def test_trainer_loss_at_step_k_plus_1_is_the_transformers_loss_of_step_k(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    tokenize(demo_corpus[:1], tmp_path / "tokens", TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    config = tmp_path / "config.yaml"
    cfg = {
        "run_name": "export",
        "save_folder": str(tmp_path / "run"),
        "max_duration": 3,
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": 2,
        "model": {
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 2,
            "n_layers": 2,
            "vocab_size": 2048,
            "max_sequence_length": SEQ,
            "weight_tying": True,
        },
        "optimizer": {"learning_rate": 0.01},
        "scheduler": {"name": "constant"},
        "data": {"paths": [str(tmp_path / "tokens")]},
    }
    config.write_text(yaml.safe_dump(cfg))
    train(config)
    step2 = tmp_path / "run" / "step2"
    assert (step2 / ".metadata").is_file()  # sharded

    result = CliRunner().invoke(olmo_train_cli, ["export-hf", str(step2), "--destination", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    hf_dir = tmp_path / "hf"
    assert (hf_dir / "tokenizer.json").read_bytes() == Path(demo_tokenizer).read_bytes()  # the manifest's
    manifest = json.loads((tmp_path / "tokens" / "manifest.json").read_text())
    assert load_tokenizer(str(hf_dir / "tokenizer.json"), "hf").sha256 == manifest["tokenizer"]["sha256"]

    ids, mask = batch_of(config, step=3)
    expected, count = transformers_loss(hf_dir, ids, mask)
    logged = metrics(tmp_path / "run")[2]
    assert logged["step"] == 3 and logged["train/supervised_tokens"] == count
    print(f"step 3: trainer loss {logged['train/loss']:.7f}, transformers loss of step 2 {expected:.7f}")
    assert logged["train/loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_finetune_an_imported_model_on_prepare_tulu_output(demo_tokenizer: str, tmp_path: Path) -> None:
    from olmo_train.convert import import_hf

    # a tiny OLMo-2 written by transformers itself: tied head (no lm_head in its files), vocabulary padded
    config = transformers.Olmo2Config(
        vocab_size=2112,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    source = tmp_path / "olmo2-tiny"
    transformers.Olmo2ForCausalLM(config).save_pretrained(source)
    shutil.copyfile(demo_tokenizer, source / "tokenizer.json")
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (source / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "pad_token": "<|padding|>"}))

    imported = import_hf(str(source), tmp_path / "imported", check=True)
    own = yaml.safe_load((imported / "config.yaml").read_text())["model"]
    assert (own["vocab_size"], own["embedding_size"], own["weight_tying"]) == (2048, 2112, True)

    conversations = tmp_path / "tulu.jsonl"
    with conversations.open("w") as f:
        for i in range(12):
            messages = [
                {"role": "user", "content": f"What is {i} times three?"},
                {"role": "assistant", "content": f"{i} times three is {3 * i}."},
            ]
            f.write(json.dumps({"id": f"ex{i}", "messages": messages}) + "\n")
    chat.prepare_chat(
        [str(conversations)], tmp_path / "sft-data", chat.ChatOptions(str(imported / "tokenizer.json"), seq_len=SEQ)
    )
    run = tmp_path / "sft"
    train(
        imported / "config.yaml",
        f"--data.paths=[{tmp_path / 'sft-data'}]",
        f"--save_folder={run}",
        "--max_duration=2",
        "--global_train_batch_size=4",
        "--device_train_microbatch_size=2",
        "--distributed_strategy=single",
        "--save_interval=2",
    )
    logged = metrics(run)
    assert [r["step"] for r in logged] == [1, 2]
    ids, mask = batch_of(run / "config.yaml", step=1)  # the resolved config the trainer saved
    assert 0 < int(mask[:, 1:].sum()) < mask[:, 1:].numel()  # only the assistant's tokens are trained
    expected, count = transformers_loss(source, ids, mask)
    assert logged[0]["train/supervised_tokens"] == count
    print(f"step 1: trainer loss {logged[0]['train/loss']:.7f}, transformers loss {expected:.7f}")
    assert logged[0]["train/loss"] == pytest.approx(expected, rel=1e-5)
