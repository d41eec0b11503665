"""z-loss through the trainer: normalized per supervised token like the cross-entropy, logged apart from it
(train/loss stays the cross-entropy), the same numbers on 1 or 2 processes, and nothing changed when it is off."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.config import ConfigError, load_config
from olmo_train.train import main
from tests.train.test_train_e2e import launch, tiny_config, write_tokens

SEQ, GBS, EMBEDDING = 16, 4, 128


def run(tmp_path: Path, name: str, **overrides: Any) -> list[dict[str, Any]]:
    tokens = tmp_path / "tokens.npy"
    if not tokens.exists():
        np.random.default_rng(0).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(tokens)
    model = {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "embedding_size": EMBEDDING}
    cfg: dict[str, Any] = {
        "save_folder": str(tmp_path / name),
        "max_duration": 3,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": None,
        "optimizer": {"learning_rate": 0.01},
        "model": model | {"max_sequence_length": SEQ},
        "data": {"paths": [str(tokens)]},
    }
    cfg.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main([str(path)]) == 0
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_z_loss_is_logged_beside_the_cross_entropy(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plain = run(tmp_path, "plain")
    capfd.readouterr()
    multiplier = 1e-3
    with_z = run(tmp_path, "z", z_loss_multiplier=multiplier)
    console = [x for x in capfd.readouterr().err.splitlines() if "| loss " in x]
    assert all("train/z_loss" not in r for r in plain)
    # an untrained model's logits are near uniform over the EMBEDDING rows of the head: logsumexp = ln(EMBEDDING)
    assert with_z[0]["train/z_loss"] == pytest.approx(multiplier * math.log(EMBEDDING) ** 2, rel=1e-2)
    # step 1: the same weights, so the same cross-entropy, bitwise; the z-loss only changes the gradients
    assert with_z[0]["train/loss"] == plain[0]["train/loss"]
    assert with_z[0]["optim/grad_norm"] != plain[0]["optim/grad_norm"]
    assert with_z[1]["train/loss"] != plain[1]["train/loss"]
    assert len(console) == 3 and all(re.search(r"\| loss [\d.]+ \| z_loss [\d.e-]+ \|", x) for x in console)


@pytest.mark.parametrize(("value", "shown"), [("0", r"0\.0"), ("-1e-4", r"-0\.0001")])
def test_a_multiplier_not_above_zero_is_refused_by_key(value: str, shown: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key 'z_loss_multiplier': must be above 0, got {shown}$"):
        load_config(None, ["--data.paths=[a.npy]", f"--z_loss_multiplier={value}"])
    assert load_config(None, ["--data.paths=[a.npy]"]).z_loss_multiplier is None  # off unless set


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_processes_give_the_one_process_numbers_with_document_masking(strategy: str, tmp_path: Path) -> None:
    """2 ranks each sum their rows' z-loss; the trainer adds the sums and divides by the global supervised tokens,
    as for the cross-entropy: the one-process numbers (step 1 to the last bits of fp32 sums; later steps carry them
    through Adam). Chunks of 5 tokens (uneven) and document masking (EOS 0 ends a document) on both."""
    data = write_tokens(tmp_path / "tokens")
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": 32}
    model |= {"loss_chunk_tokens": 5, "document_masking": True, "eos_token_id": 0}
    numbers = {}
    for nproc, name in ((1, "single"), (2, strategy)):
        tmp = tmp_path / name
        tmp.mkdir()
        cfg = tiny_config(tmp, data, model=model, z_loss_multiplier=1e-2, distributed_strategy=name, max_duration=3)
        launch(cfg, nproc)
        numbers[name] = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    one, two = numbers["single"], numbers[strategy]
    assert [r["step"] for r in two] == [1, 2, 3]
    assert two[0]["train/z_loss"] == pytest.approx(one[0]["train/z_loss"], rel=1e-6)
    assert two[0]["train/loss"] == pytest.approx(one[0]["train/loss"], rel=1e-6)
    assert two[0]["optim/grad_norm"] == pytest.approx(one[0]["optim/grad_norm"], rel=1e-5)
    for a, b in zip(one, two, strict=True):
        assert b["train/z_loss"] == pytest.approx(a["train/z_loss"], rel=1e-4), a["step"]
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-4), a["step"]
