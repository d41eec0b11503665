"""configs/olmo3-tiny.yaml trains with the loop as written (windows, GQA, document masking), and its checkpoint
exports as transformers' olmo3 with the same logits (`export-hf --check`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from olmo_data.config import load_config
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_train.convert import export_hf
from olmo_train.train import train

REPO = Path(__file__).resolve().parents[2]


def test_the_tiny_olmo3_config_trains_and_exports(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    tokens = tmp_path / "tokens"
    tokenize(demo_corpus[:1], tokens, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    overrides = [
        f"--data.paths=[{tokens}]",
        f"--save_folder={tmp_path / 'run'}",
        "--max_duration=3",
        "--save_interval=3",
        "--global_train_batch_size=4",
        "--device_train_microbatch_size=2",
        "--model.vocab_size=2048",  # the demo tokenizer of the tests
        "--model.max_sequence_length=64",
        "--model.sliding_window.pattern=[16,16,16,-1]",  # windows shorter than the instances
    ]
    cfg = load_config(REPO / "configs/olmo3-tiny.yaml", overrides)
    assert cfg.model.attention_windows() == [16, 16, 16, None] and cfg.model.document_masking
    assert train(cfg) == 0
    losses = [json.loads(line)["train/loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    out = export_hf(tmp_path / "run" / "step3", tmp_path / "hf", check=True)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "olmo3" and config["sliding_window"] == 16
    assert config["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
