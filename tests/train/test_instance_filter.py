"""data.instance_filter in the trainer: on data with planted repetitive instances, each step's
`train/masked_instances` is OLMo's rule (the tests' own re-implementation) applied to the batch `inspect-batch` shows
for the step, `train/supervised_tokens` drops by exactly those instances' targets, and the batches (their
fingerprints) are the same as without the filter; with the filter off the run is the one it was before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from olmo_data.config import ConfigError, load_config
from olmo_data.dataset.order import build_order
from olmo_data.run.batches import inspect_batch
from olmo_train.train import labels_for, train
from tests.data.dataset.test_instance_filter import planted_tokens, reference_masked
from tests.slurm_cluster import REPO

SEQ, GBS, N, SEED, STEPS = 128, 4, 30, 11, 7


def write_config(folder: Path, tokens: Path, **data: Any) -> Path:
    cfg: dict[str, Any] = {
        "seed": SEED,
        "save_folder": str(folder / "run"),
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": None,
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ},
        "data": {"paths": [str(tokens)], **data},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture()
def tokens(tmp_path: Path) -> Path:
    """Planted repetitions in every other instance that step 1 does not train, so step 1 has none."""
    first = set(build_order(N, SEED)[:GBS].tolist())
    path = tmp_path / "tokens.npy"
    planted_tokens(path, SEQ, N, [i for i in range(N) if i not in first][::2])
    return path


def test_masked_instances_follow_olmos_rule_over_the_inspected_batches(tmp_path: Path, tokens: Path) -> None:
    on = write_config(tmp_path / "on", tokens, instance_filter={"enabled": True})
    off = write_config(tmp_path / "off", tokens)
    assert train(load_config(on)) == 0 and train(load_config(off)) == 0
    got, base = records(tmp_path / "on"), records(tmp_path / "off")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    masked_steps = []
    for r, b in zip(got, base, strict=True):
        report = inspect_batch(str(on), step=r["step"])
        expected = [i for i in report.instances if reference_masked(i.token_ids.tolist(), (13, 1, 32))]
        assert r["train/masked_instances"] == len(expected) == report.masked_instances, r["step"]
        assert r["train/batch_fingerprint"] == b["train/batch_fingerprint"] == report.batch_fingerprint
        # each masked instance takes its SEQ - 1 targets out of the loss normaliser
        assert b["train/supervised_tokens"] - r["train/supervised_tokens"] == len(expected) * (SEQ - 1)
        assert "train/masked_instances" not in b
        if expected:
            masked_steps.append(r["step"])
    assert 1 not in masked_steps and len(masked_steps) >= 3, masked_steps
    assert sum(r["train/masked_instances"] for r in got) >= 5
    # until an instance is masked the two runs are the same run; after it they differ
    first = masked_steps[0]
    for r, b in zip(got[: first - 1], base[: first - 1], strict=True):
        assert (r["train/loss"], r["optim/grad_norm"]) == (b["train/loss"], b["optim/grad_norm"])
    assert got[first - 1]["train/loss"] != base[first - 1]["train/loss"]


def test_labels_of_a_masked_instance() -> None:
    ids = torch.arange(12).reshape(3, 4)
    mask = torch.tensor([[True, True, False, True]] * 3)
    keep = torch.tensor([True, False, True])
    assert labels_for(ids, mask, keep).tolist() == [[1, -100, 3], [-100, -100, -100], [9, -100, 11]]
    assert labels_for(ids, mask, None).tolist() == labels_for(ids, mask).tolist()


def test_config_keys_are_checked(tmp_path: Path, tokens: Path) -> None:
    cases = [
        (
            {"enabled": True, "repetition_max_period": 0},
            "'data.instance_filter.repetition_max_period': must be positive",
        ),
        (
            {"enabled": True, "repetition_max_count": -3},
            "'data.instance_filter.repetition_max_count': must be positive",
        ),
        (
            {"enabled": True, "repetition_min_period": 4, "repetition_max_period": 3},
            "'data.instance_filter.repetition_min_period': 4 is above data.instance_filter.repetition_max_period (3)",
        ),
        (
            {"repetition_max_count": 8},
            "'data.instance_filter.repetition_max_count': set, but data.instance_filter.enabled is not",
        ),
        ({"enabled": True, "max_count": 8}, "unknown config key 'data.instance_filter.max_count'"),
        ({"enabled": "on"}, "'data.instance_filter.enabled': got 'on'"),
    ]
    for section, message in cases:
        with pytest.raises(ConfigError) as e:
            load_config(write_config(tmp_path / "bad", tokens, instance_filter=section))
        assert message in str(e.value), (section, str(e.value))
    cfg = load_config(write_config(tmp_path / "good", tokens, instance_filter={"enabled": True}))
    assert (cfg.data.instance_filter.repetition_max_period, cfg.data.instance_filter.repetition_min_period) == (13, 1)
    assert cfg.data.instance_filter.repetition_max_count == 32


@pytest.mark.slow
def test_two_ranks_count_all_masked_instances(tmp_path: Path, tokens: Path) -> None:
    """With 2 processes (DDP on gloo) each rank filters its own rows; the logged count is both ranks' together."""
    one = write_config(tmp_path / "one", tokens, instance_filter={"enabled": True})
    two = write_config(tmp_path / "two", tokens, instance_filter={"enabled": True})
    assert train(load_config(one)) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "olmo_train", str(two), "--distributed_strategy=ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    keys = ("train/masked_instances", "train/supervised_tokens", "train/batch_fingerprint")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert sum(r["train/masked_instances"] for r in b) >= 5
