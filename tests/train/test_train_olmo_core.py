"""Our trainer on an OLMo-core run's batches (`data.olmo_core`), checked against OLMo-core's own loader.

OLMo-core's config classes build a run and write its config.json (as its ConfigSaverCallback does); its loader,
driven as its Trainer drives it on 2 ranks, gives the reference batches. A tiny model of ours pointed at that
config.json trains a few steps (torchrun, 2 processes): the batch fingerprints it logs must be those of OLMo-core's
input_ids, step for step; and `inspect-batch` of our run shows the same batch, with the run's losses on it.
Tests that need OLMo-core skip, saying so, without `ai2-olmo-core`; the refusals run without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.config import ConfigError, load_config
from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.errors import DataError
from olmo_data.run import find_spikes, inspect_batch
from tests.train.test_train_e2e import launch

L, SEED, STEPS = 64, 6198, 3


@pytest.fixture(scope="module")
def token_paths(demo_token_parts: list[str]) -> list[str]:
    return demo_token_parts[:6]


def ours(tmp_path: Path, config_json: str, **overrides: Any) -> Path:
    """A tiny config of ours that trains on the OLMo-core run's batches."""
    cfg: dict[str, Any] = {
        "run_name": "on-olmo-core",
        "seed": 1,
        "save_folder": str(tmp_path / "run"),
        "max_duration": STEPS,
        "device_train_microbatch_size": 2,
        "save_interval": 100,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "vocab_size": 2048, "max_sequence_length": L},
        "optimizer": {"learning_rate": 0.01},
        "data": {"olmo_core": config_json, "prefetch_batches": 1},
    }
    cfg.update(overrides)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_trains_on_olmo_core_batches_on_two_ranks(
    core: Any, token_paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instance filter's masked instances included (OLMo-core's instance_mask, as masked labels)."""
    from olmo_core.data import NumpyFSLDatasetConfig
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    repetitive = tmp_path / "repetitive.npy"  # 128 instances of a 3-token sequence over and over
    np.tile(np.array([5, 6, 7], dtype=np.uint16), 128 * L // 3 + 1)[: 128 * L].tofile(repetitive)
    dataset = NumpyFSLDatasetConfig(
        tokenizer=core.tokenizer_config(),
        paths=[*token_paths, str(repetitive)],
        sequence_length=L,
        instance_filter_config=InstanceFilterConfig(repetition_max_count=8),
    )
    config = core.experiment_config(
        dataset, global_batch_size=8 * L, seed=SEED, work_dir=str(tmp_path / "work"), save_folder=str(tmp_path / "x")
    )
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    reference = core.drive_loader(config, world_size=2, last_step=STEPS, monkeypatch=monkeypatch)
    want = [batch_fingerprint(core.global_rows(reference, s, "input_ids")) for s in range(1, STEPS + 1)]
    assert len(set(want)) == STEPS
    launch(ours(tmp_path, config_json), 2)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/batch_fingerprint"] for m in metrics] == want
    assert all(np.isfinite(m["train/loss"]) for m in metrics)
    assert sum(m["train/masked_instances"] for m in metrics) > 0
    for m, s in zip(metrics, range(1, STEPS + 1), strict=True):  # OLMo-core's instance_mask, on both ranks
        keep = core.global_rows(reference, s, "instance_mask")
        assert m["train/masked_instances"] == int((~keep).sum())
        assert m["train/supervised_tokens"] == int(keep.sum()) * (L - 1)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["global_train_batch_size"] == 8  # OLMo-core's 512 tokens / 64
    # inspect-batch of our run: OLMo-core's batch, and the losses our run had on it
    report = inspect_batch(str(tmp_path / "run" / "config.yaml"), step=2)
    assert report.batch_fingerprint == want[1] and report.trainer == "olmo-core"
    assert [i.instance for i in report.instances] == core.global_rows(reference, 2, "index").tolist()
    assert report.loss_record is not None and all(i.supervised_tokens is not None for i in report.instances)
    # and spikes names the instances behind a jump: steps 1 and 2 logged lower, so that step 3 is one
    lines = [{**m, "train/loss": m["train/loss"] - 3.0 * (m["step"] < 3)} for m in metrics]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    spikes = find_spikes(str(tmp_path / "run"), window=2, z=3.0, top=3)
    assert [s.step for s in spikes.spikes] == [3] and len(spikes.spikes[0].contributors) == 3
    assert {c.instance for c in spikes.spikes[0].contributors} <= set(core.global_rows(reference, 3, "index").tolist())


def test_padded_batches_train_with_their_label_mask(
    core: Any, token_paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process, padded instances: the padding is not trained (OLMo-core's label mask as masked labels); a
    stopped run resumes on OLMo-core's next batch."""
    from olmo_core.data import NumpyPaddedFSLDatasetConfig

    dataset = NumpyPaddedFSLDatasetConfig(tokenizer=core.tokenizer_config(), paths=token_paths, sequence_length=L)
    config = core.experiment_config(
        dataset, global_batch_size=4 * L, seed=SEED, work_dir=str(tmp_path / "work"), save_folder=str(tmp_path / "x")
    )
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    reference = core.drive_loader(config, world_size=1, last_step=2, monkeypatch=monkeypatch)
    mine = ours(tmp_path, config_json, max_duration=2)
    launch(mine, 1, "--stop_at=1")  # stopped after step 1, resumed: step 2 is still OLMo-core's step 2
    launch(mine, 1)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m, step in zip(metrics, reference[0], strict=True):
        assert m["train/batch_fingerprint"] == batch_fingerprint(step.input_ids)
        assert m["train/supervised_tokens"] == int(step.label_mask[:, 1:].sum())


def test_a_batch_size_schedule_is_refused_by_name(core: Any, token_paths: list[str], tmp_path: Path) -> None:
    from olmo_core.train import Duration

    config = core.experiment_config(
        core_fsl(core, token_paths),
        global_batch_size=8 * L,
        seed=SEED,
        work_dir=None,
        save_folder="/x",
        batch_sizes=[4 * L, 8 * L],
        schedule=[Duration.steps(0), Duration.steps(5)],
    )
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    proc = launch_failing(ours(tmp_path, config_json))
    assert "BatchSizeSchedulerCallback" in proc and "not supported" in proc
    assert not (tmp_path / "run").exists()


def core_fsl(core: Any, paths: list[str]) -> Any:
    from olmo_core.data import NumpyFSLDatasetConfig

    return NumpyFSLDatasetConfig(tokenizer=core.tokenizer_config(), paths=paths, sequence_length=L)


def launch_failing(config: Path) -> str:
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "olmo_train", str(config)], env=env, text=True, capture_output=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


# -- the config key and the one reader (no OLMo-core needed) ------------------------------------------------------


def olmo_core_json(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "dataset": {"_CLASS_": "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig", "paths": ["/a.npy"]},
                "data_loader": {"_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig"},
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"olmo_core": "C", "paths": ["/a.npy"]}, "config key 'data.paths': data.olmo_core (C) gives the run's data"),
        ({"olmo_core": "C", "mix": "m"}, "config key 'data.mix'"),
        ({"olmo_core": "C", "order_path": "o"}, "config key 'data.order_path'"),
        ({"olmo_core": "C", "instance_filter": {"enabled": True}}, "dataset.instance_filter_config"),
        ({}, "set data.paths (token files or directories), data.mix or data.olmo_core"),
    ],
)
def test_data_olmo_core_excludes_our_data_keys(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": data}))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value)


def test_the_config_reader_names_the_commands_for_an_olmo_core_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(olmo_core_json(tmp_path))
    assert "config.json of an OLMo-core run" in str(e.value) and "data.olmo_core" in str(e.value)


def test_data_olmo_core_must_be_an_olmo_core_config(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}")
    path = ours(tmp_path, str(other))
    with pytest.raises(DataError, match="is not the config.json of an OLMo-core run"):
        inspect_batch(str(path), step=1)
