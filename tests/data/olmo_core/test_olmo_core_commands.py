"""The data commands on an OLMo-core config.json without OLMo-core installed: their text, refusals, and the one
config reader's line for commands that do not read that form. (Against OLMo-core's own loader, the commands are
checked in tests/data/olmo_core/test_olmo_core_data.py, through tests/olmo_core_commands.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.olmo_core import build_olmo_core_order, order_file_name

L = 16


def core_config(tmp_path: Path, **trainer: Any) -> str:
    """An OLMo-core config.json over one token file of 40 instances (5 batches of 8 an epoch), 2 epochs long."""
    tokens = tmp_path / "a.npy"
    (np.arange(40 * L, dtype=np.uint16) % 97 + 2).tofile(tokens)
    config = {
        "dataset": {
            "_CLASS_": "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig",
            "tokenizer": {"vocab_size": 2048, "eos_token_id": 0, "pad_token_id": 1},
            "paths": [str(tokens)],
            "sequence_length": L,
        },
        "data_loader": {
            "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
            "global_batch_size": 8 * L,
            "seed": 7,
            "work_dir": str(tmp_path / "work"),
        },
        "trainer": {"max_duration": {"value": 2, "unit": "epochs"}, **trainer},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def run(args: list[str]) -> Any:
    return CliRunner().invoke(data_main, args)


def test_inspect_batch_text_says_olmo_cores_terms(tmp_path: Path) -> None:
    config = core_config(tmp_path)
    out = run(["inspect-batch", config, "--step", "6"])
    assert out.exit_code == 0, out.output
    assert "step 6 = global batch 5 (epoch 2, batch 0 of 5 per epoch)" in out.output
    assert "global batch 128 tokens (8 instances)" in out.output and "rebuilt (" in out.output
    order = build_olmo_core_order(40, 7, 2)
    got = json.loads(run(["inspect-batch", config, "--step", "6", "--json"]).output)
    assert [i["instance"] for i in got["instances"]] == order[:8].tolist()
    assert got["run_steps"] == 10 and got["order_note"].startswith("rebuilt") and got["epoch"] == 2


def test_trace_of_tokens_names_olmo_core_steps(tmp_path: Path) -> None:
    """Tokens 5..8 of the file are instance 0: trained once per epoch, at the step whose batch holds it."""
    config = core_config(tmp_path)
    tokens = ",".join(str(t) for t in (np.arange(5, 9) % 97 + 2))
    got = json.loads(run(["trace", config, "--tokens", tokens, "--json", "--world-size", "2"]).output)
    want = []
    for epoch in (1, 2):
        p = int(np.flatnonzero(build_olmo_core_order(40, 7, epoch) == 0)[0])
        want.append(((epoch - 1) * 5 + p // 8 + 1, epoch, (p % 8) % 2))
    hits = [(h["step"], h["epoch"], h["rank"]) for h in got["hits"] if h["instance"] == 0]
    assert hits == want and got["last_step"] == 10


def test_build_order_writes_olmo_cores_files_into_its_work_dir(tmp_path: Path) -> None:
    config = core_config(tmp_path)
    out = run(["build-order", config, "--epochs", "2"])
    assert out.exit_code == 0, out.output
    for epoch in (1, 2):
        path = tmp_path / "work" / order_file_name(40, epoch, 7)
        assert path.read_bytes() == build_olmo_core_order(40, 7, epoch).astype("<u4").tobytes()
    assert "OLMo-core's name and bytes" in out.output
    out = run(["inspect-batch", config, "--step", "1"])
    assert f"read from {tmp_path / 'work'}" in out.output
    (tmp_path / "work" / order_file_name(40, 1, 7)).write_bytes(np.arange(40, dtype="<u4").tobytes())
    out = run(["build-order", config])
    assert out.exit_code == 2 and "not the order OLMo-core builds for epoch 1" in out.output
    assert run(["build-order", config, "--first-epoch", "0"]).exit_code == 2


def test_stats_counts_as_olmo_core(tmp_path: Path) -> None:
    out = run(["stats", core_config(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "40 instances of 16 tokens" in out.output and "5 steps per epoch" in out.output
    assert "duration 2 epochs: 10 steps" in out.output and "epoch 1 order: rebuilt" in out.output


def test_stats_names_each_epochs_order_without_building_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stats says where each epoch's order comes from as inspect-batch does, but never shuffles one to say so (an
    epoch of OLMo 3's pretraining took 98 s): a file there is named and sized, an absent one said to be rebuilt."""
    from olmo_data.olmo_core import order as order_module

    config = core_config(tmp_path)
    assert run(["build-order", config, "--epochs", "1"]).exit_code == 0  # epoch 1's file there, epoch 2's not

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("stats built an order")

    monkeypatch.setattr(order_module, "build_olmo_core_order", refuse)
    got = json.loads(run(["stats", config, "--json"]).output)
    work = tmp_path / "work"
    assert got["orders"] == [
        f"read from {work / order_file_name(40, 1, 7)}",
        f"rebuilt ({work / order_file_name(40, 2, 7)} not found)",
    ]
    (work / order_file_name(40, 1, 7)).write_bytes(bytes(12))
    out = run(["stats", config])
    assert out.exit_code == 2 and "12 bytes, but OLMo-core's order of epoch 1 over 40 instances" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["spikes"], "spikes reads the loss and per-instance loss records"),
        (["lineage"], "this is the config.json of an OLMo-core run, not a config of ours"),
        (["trace", "--spans", "some text"], "--spans needs the tokenizer"),  # covered: its files name none
        (["stats", "--sequence-length", "8"], "gives the data, batch size and duration"),
        (["inspect-batch", "--step", "1", "--decode"], "needs --tokenizer PATH"),
        (["inspect-batch", "--step", "1", "--rank", "0", "--world-size", "3"], "cannot be split over 3 ranks"),
    ],
)
def test_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    out = run([args[0], core_config(tmp_path), *args[1:]])
    assert out.exit_code == 2 and message in out.output, out.output


@pytest.mark.parametrize(
    ("hard_stop", "steps"),
    [
        ({"value": 7, "unit": "steps"}, 7),
        ({"value": 5 * 8 * L, "unit": "tokens"}, 5),
        ({"value": 3, "unit": "epochs"}, 10),
    ],
)
def test_the_run_stops_at_hard_stop_or_max_duration_whichever_first(
    tmp_path: Path, hard_stop: dict[str, Any], steps: int
) -> None:
    """OLMo-core's Trainer stops once max_duration (2 epochs: 10 steps) or hard_stop is due: OLMo 3 7B's
    pretraining stopped at step 597,046 of a 5e12-token max_duration."""
    config = core_config(tmp_path, hard_stop=hard_stop)
    stats = json.loads(run(["stats", config, "--json"]).output)
    assert stats["steps"] == steps and "hard_stop" in stats["duration"]
    got = json.loads(run(["trace", config, "--tokens", "5,6,7,8", "--json"]).output)
    assert got["last_step"] == steps
    out = run(["inspect-batch", config, "--step", str(steps + 1)])
    assert out.exit_code == 0 and f"the run trains {steps} steps" in out.output


def test_a_named_mix_reads_the_data_paths_txt_olmo_core_saved(tmp_path: Path) -> None:
    """OLMo 3's scripts name a data mix; OLMo-core saves its files beside config.json in dataset order, after
    source_permutation_seed: read as they are (not permuted again), the batches are those of the listed paths."""
    listed = json.loads(Path(core_config(tmp_path)).read_text())
    b = tmp_path / "b.npy"
    (np.arange(24 * L, dtype=np.uint16) % 89 + 2).tofile(b)
    listed["dataset"]["paths"] = [str(b), str(tmp_path / "a.npy")]  # the permuted order OLMo-core wrote
    (tmp_path / "listed.json").write_text(json.dumps(listed))
    saved = tmp_path / "step100"
    saved.mkdir()
    mixed = json.loads(json.dumps(listed))
    del mixed["dataset"]["paths"]
    mixed["dataset"] |= {"mix": "OLMo-mix-0625-official", "mix_base_dir": "s3://bucket", "source_permutation_seed": 123}
    (saved / "config.json").write_text(json.dumps(mixed))
    out = run(["inspect-batch", str(saved / "config.json"), "--step", "3", "--json"])
    assert out.exit_code == 2 and "data_paths.txt it saves beside config.json" in out.output
    (saved / "data_paths.txt").write_text("\n".join(listed["dataset"]["paths"]) + "\n")
    got = json.loads(run(["inspect-batch", str(saved / "config.json"), "--step", "3", "--json"]).output)
    want = json.loads(run(["inspect-batch", str(tmp_path / "listed.json"), "--step", "3", "--json"]).output)
    assert got["batch_fingerprint"] == want["batch_fingerprint"] and got["num_instances"] == 64
    assert [i["path"] for i in got["instances"]] == [i["path"] for i in want["instances"]]
