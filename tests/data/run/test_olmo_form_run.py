"""A run of a config in OLMo's own form (as every OLMo 2 config is: `memmap_dtype: uint32` over headerless token
files without a manifest, `${run_name}` in `save_folder`, OLMo's `instance_filter` section without `enabled`),
read back by the data commands exactly as the trainer read it: stats count its instances, build-order writes where
it reads, inspect-batch shows the batch fingerprint it logged and the instances it masked, trace finds the step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from tests.data.config.test_olmo_config import OLMO2_7B_SHAPED

REPO = Path(__file__).resolve().parents[3]
SEQ, GBS, BASE = 16, 4, 70_000  # token ids above 65535: read as uint16 they would be other tokens


def olmo_form_config(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """The published OLMo 2 config, shrunk to a tiny model over two uint32 token files of ours (no manifest)."""
    rng = np.random.default_rng(3)
    tokens = (BASE + rng.integers(0, 500, 40 * SEQ)).astype(np.uint32)
    tokens[5 * SEQ : 6 * SEQ] = BASE + 7  # one instance of a single repeated token: the instance filter masks it
    (tmp_path / "tok").mkdir()
    tokens[: 24 * SEQ].tofile(tmp_path / "tok" / "a.npy")
    tokens[24 * SEQ :].tofile(tmp_path / "tok" / "b.npy")
    raw = yaml.safe_load(OLMO2_7B_SHAPED)
    raw.pop("evaluators")
    raw.pop("tokenizer")
    raw["model"] |= {
        "d_model": 32,
        "n_heads": 2,
        "n_layers": 1,
        "mlp_hidden_size": 128,
        "max_sequence_length": SEQ,
        "vocab_size": BASE + 512,
        "embedding_size": BASE + 512,
        "eos_token_id": BASE + 510,
        "pad_token_id": BASE + 511,
    }
    raw |= {"global_train_batch_size": GBS, "max_duration": 2, "device_train_microbatch_size": GBS}
    raw["scheduler"] |= {"units": "steps", "t_warmup": 1, "t_max": 2}
    raw |= {"save_folder": str(tmp_path / "run-${run_name}"), "run_name": "tiny", "precision": "fp32"}
    raw |= {"save_interval": 1000, "save_interval_unsharded": None, "eval_interval": None}
    raw["data"]["paths"] = [str(tmp_path / "tok" / "a.npy"), str(tmp_path / "tok" / "b.npy")]
    path = tmp_path / "olmo-form.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, tokens


@pytest.mark.slow
def test_the_data_commands_read_an_olmo_form_config_as_the_trainer_does(tmp_path: Path) -> None:
    config, tokens = olmo_form_config(tmp_path)
    run = tmp_path / "run-tiny"  # ${run_name} resolved, as the trainer resolves it
    res = CliRunner().invoke(main, ["build-order", str(config)])
    assert res.exit_code == 0, res.output
    assert (run / "train_data" / "global_indices.npy").is_file() and not list(tmp_path.glob("run-$*"))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "olmo_train", str(config)], env=env, text=True, capture_output=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logged = {
        r["step"]: r
        for r in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
        if "train/batch_fingerprint" in r
    }
    assert sorted(logged) == [1, 2]

    res = CliRunner().invoke(main, ["stats", "--config", str(config), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["num_instances"] == 40  # the trainer's: 24 + 16 instances of 16 uint32 tokens

    masked_total = 0
    for step in (1, 2):
        res = CliRunner().invoke(main, ["inspect-batch", str(config), "--step", str(step), "--json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.output)
        assert report["num_instances"] == 40 and report["assumed_dtype"] is None
        assert report["batch_fingerprint"] == logged[step]["train/batch_fingerprint"]
        assert report["instance_filter"] is not None  # OLMo's section (no `enabled` key) turns it on
        ids = [i["instance"] for i in report["instances"]]
        for inst in report["instances"]:
            start = inst["instance"] * SEQ
            assert inst["token_ids"] == tokens[start : start + SEQ].tolist()
            assert inst["masked"] == (inst["instance"] == 5)
        masked_total += report["masked_instances"]
        assert logged[step]["train/masked_instances"] == report["masked_instances"]
        if step == 1:
            first = report["instances"][0]["token_ids"][:6]
            res = CliRunner().invoke(
                main, ["trace", str(config), "--tokens", ",".join(map(str, first)), "--json", "--no-lineage"]
            )
            assert res.exit_code == 0, res.output
            hits = json.loads(res.output)["stages"][0]["report"]["hits"]
            assert any(h["step"] == 1 and h["instance"] == ids[0] for h in hits), hits


def test_an_olmo_data_key_the_data_side_does_not_honour_is_refused_by_name(tmp_path: Path) -> None:
    config, _ = olmo_form_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["data"]["custom_dataset"] = {"name": "mine"}
    config.write_text(yaml.safe_dump(raw))
    for command in (["stats", "--config", str(config)], ["inspect-batch", str(config), "--step", "1"]):
        res = CliRunner().invoke(main, command)
        assert res.exit_code == 2 and "data.custom_dataset" in res.output, res.output
        assert "Traceback" not in res.output
