"""The loop's bookkeeping, in one process: durations in tokens and epochs, in-loop evaluation, pruning of old
checkpoints, the resolved config, bad checkpoints, and wandb (offline) keeping its run id across a resume."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.config import load_config
from olmo_data.errors import DataError
from olmo_train.train import main, train

SEQ, GBS = 16, 4


@pytest.fixture()
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(path)  # 30 instances
    return str(path)


def config(tmp_path: Path, tokens: str, file: str = "c.yaml", **overrides: Any) -> Path:
    cfg: dict[str, Any] = {
        "save_folder": str(tmp_path / "run"),
        "max_duration": 3,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": 1,
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ},
        "data": {"paths": [tokens]},
    }
    cfg.update(overrides)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(cfg))
    return path


def records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_tokens_duration_eval_pruning_and_resolved_config(tmp_path: Path, tokens: str) -> None:
    evaluators = [{"label": "heldout", "paths": [tokens], "max_batches": 2}]
    cfg = config(
        tmp_path,
        tokens,
        max_duration=f"{5 * GBS * SEQ - 10}T",
        eval_interval=2,
        evaluators=evaluators,
        save_num_checkpoints_to_keep=2,
    )
    assert main([str(cfg)]) == 0
    got = records(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]  # tokens rounded up to whole steps
    assert [("eval/heldout/loss" in r) for r in got] == [False, True, False, True, False]
    assert 3.0 < got[1]["eval/heldout/loss"] < 5.0  # about ln(64) for an untrained model
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("step*")) == ["step4", "step5"], "only the last 2 are kept"
    assert (run / "latest").resolve().name == "step5"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["max_duration"] == f"{5 * GBS * SEQ - 10}T" and saved["evaluators"][0]["label"] == "heldout"


def test_epochs_duration_and_finished_run_is_a_no_op(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path, tokens, max_duration="2ep", save_interval=100)
    assert main([str(cfg)]) == 0
    assert [r["step"] for r in records(tmp_path)] == list(range(1, 15))  # 30 // 4 = 7 batches per epoch
    assert records(tmp_path)[-1]["train/epoch"] == 1
    capfd.readouterr()
    assert main([str(cfg)]) == 0  # rerun of a finished run: resumes at the end, trains nothing, duplicates nothing
    assert len(records(tmp_path)) == 14
    err = capfd.readouterr().err
    assert "nothing to train: the run is at step 14, and max_duration is 14 steps" in err
    assert "training steps 15..14" not in err


def test_console_lines_say_percent_done_and_eta(tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, tokens, max_duration=4, console_log_interval=2)
    assert main([str(cfg)]) == 0
    lines = [x for x in capfd.readouterr().err.splitlines() if "| loss " in x]
    assert len(lines) == 2
    assert "step 2/4 (50%)" in lines[0] and re.search(r"\| eta \d+s", lines[0])
    assert "step 4/4 (100%)" in lines[1] and "| eta 0s" in lines[1]


def test_format_duration() -> None:
    from olmo_train.train import format_duration

    assert [format_duration(x) for x in (0.4, 59.6, 245, 3599, 11220)] == ["0s", "1m00s", "4m05s", "59m59s", "3h07m"]


def test_missing_data_leaves_no_save_folder(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, str(tmp_path / "nowhere.npy"))
    assert main([str(cfg)]) == 2
    assert "nowhere.npy" in capfd.readouterr().err
    assert not (tmp_path / "run").exists()


def test_bad_load_path_and_eval_data(tmp_path: Path, tokens: str) -> None:
    with pytest.raises(DataError, match=r"load_path .*nowhere: no such checkpoint directory"):
        train(load_config(config(tmp_path, tokens, load_path=str(tmp_path / "nowhere"))))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: not a complete checkpoint \(no trainer_state.json\)"):
        train(load_config(config(tmp_path, tokens, load_path=str(tmp_path / "empty"))))
    small = [{"label": "tiny", "paths": [tokens]}]
    with pytest.raises(DataError, match=r"evaluator 'tiny': 30 instances are fewer than one eval batch of 64"):
        folder = str(tmp_path / "eval-run")
        train(
            load_config(
                config(
                    tmp_path, tokens, eval_interval=2, evaluators=small, device_eval_batch_size=64, save_folder=folder
                )
            )
        )
    assert not (tmp_path / "eval-run").exists(), "refused at start: no step trained, no save folder left"


def test_changed_data_is_refused_on_resume(tmp_path: Path, tokens: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, tokens)
    assert main([str(cfg), "--stop_at=1"]) == 0
    other = tmp_path / "other.npy"
    np.random.default_rng(5).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(other)
    assert main([str(cfg), f"--data.paths=[{other}]", "--global_train_batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "step1: the checkpoint was trained with other data settings: data fingerprint" in err
    assert "global_train_batch_size 4 != 2" in err and "--reset_trainer_state" in err and "--force_load" in err
    assert main([str(cfg), f"--data.paths=[{other}]", "--force_load"]) == 0  # moved or edited data, accepted
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3]


def test_too_little_data_for_one_batch(tmp_path: Path, tokens: str) -> None:
    with pytest.raises(DataError, match=r"30 instances of 16 tokens, fewer than one global batch of 64"):
        train(load_config(config(tmp_path, tokens, global_train_batch_size=64)))


@pytest.mark.slow
def test_wandb_offline_keeps_run_id_on_resume(tmp_path: Path, tokens: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_cfg = {"enabled": True, "mode": "offline", "project": "olmo-test"}
    cfg = config(tmp_path, tokens, max_duration=4, wandb=wandb_cfg)
    assert main([str(cfg), "--stop_at=2"]) == 0
    first = json.loads((tmp_path / "run" / "latest" / "trainer_state.json").read_text())["wandb_run_id"]
    assert first
    assert main([str(cfg)]) == 0
    state = json.loads((tmp_path / "run" / "latest" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["wandb_run_id"] == first
    runs = sorted(p.name for p in (tmp_path / "run" / "wandb").glob("offline-run-*"))
    # wandb names a run's folder by its start second and id, adding -1 when both starts fall in the same second
    assert len(runs) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first}(-\d+)?", name) for name in runs)


@pytest.mark.parametrize("kind", ["step2", "step2-unsharded"])
def test_load_path_url(tmp_path: Path, tokens: str, http_root: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    root, url = http_root
    base = config(tmp_path, tokens, save_interval_unsharded=2)
    assert main([str(base), "--stop_at=2"]) == 0
    shutil.copytree(tmp_path / "run" / kind, root / kind)
    finetune = config(
        tmp_path, tokens, "ft.yaml", save_folder=str(tmp_path / "ft"), load_path=f"{url}/{kind}", max_duration=3
    )
    assert main([str(finetune)]) == 0  # continues the base run: same data, so steps 3.. only
    got = [json.loads(x) for x in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    ref = records(tmp_path)
    assert [r["step"] for r in got] == [3] and got[0]["train/tokens_seen"] == 3 * GBS * SEQ
    assert main([str(base)]) == 0  # the base run itself continued locally gives the same step 3
    assert records(tmp_path)[2]["train/loss"] == got[0]["train/loss"]
    assert ref[-1]["step"] == 2


def test_load_path_url_that_stalls_mid_body_fails_within_the_timeout(
    tmp_path: Path, tokens: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that sends half of model.pt and then nothing: the run stops after the configured timeout per
    attempt with one line naming the file's URL, trains nothing, and leaves no model.pt in the download cache."""
    import time

    from olmo_train.checkpoint.fetch import cache_entry
    from tests.flaky_server import Faults, FlakyServer

    base = config(tmp_path, tokens, save_interval_unsharded=2)
    assert main([str(base), "--stop_at=2"]) == 0
    shutil.copytree(tmp_path / "run" / "step2-unsharded", tmp_path / "www" / "step2-unsharded")
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLMO_DATA_REMOTE_TIMEOUT_S", "0.3")
    monkeypatch.setenv("OLMO_DATA_REMOTE_ATTEMPTS", "2")
    monkeypatch.setattr("olmo_data.remote.reader._READER", None)  # the next reader reads the settings above
    capsys.readouterr()
    with FlakyServer(tmp_path / "www", Faults(stall="model.pt")) as server:
        url = f"{server.url}/step2-unsharded"
        finetune = config(tmp_path, tokens, "ft.yaml", save_folder=str(tmp_path / "ft"), load_path=url)
        began = time.monotonic()
        assert main([str(finetune)]) == 2
        assert time.monotonic() - began < 10  # before: as long as the server stayed silent
        assert server.injected["stall"] == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "model.pt" in x)
    assert line.startswith(f"error: {url}/model.pt: ranged read of bytes 0..") and "after 2 attempts" in line, err
    assert "Traceback" not in err
    assert "no answer for 0.3 s (ReadTimeoutError)" in line, err
    assert not (tmp_path / "ft" / "metrics.jsonl").exists()
    entry = cache_entry(url)
    assert (entry / "checksums.json").is_file() and not list(entry.glob("*model.pt*"))


def test_signal_handlers_are_restored_after_a_run(tmp_path: Path, tokens: str) -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert main([str(config(tmp_path, tokens, max_duration=1))]) == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_trains_on_a_mix_manifest(tmp_path: Path, tokens: str) -> None:
    from olmo_data.dataset.mixture import build_mix, parse_spec
    from olmo_data.run.batches import inspect_batch

    other = tmp_path / "other.npy"
    np.random.default_rng(9).integers(0, 64, 50 * SEQ).astype(np.uint16).tofile(other)
    spec = {
        "seed": 1,
        "sequence_length": SEQ,
        "total_tokens": 40 * SEQ,
        "sources": [
            {"name": "a", "paths": [tokens], "share": 0.25},
            {"name": "b", "paths": [str(other)], "share": 0.75},
        ],
    }
    build_mix(parse_spec(spec), str(tmp_path / "mix"))
    cfg = config(tmp_path, tokens, data={"mix": str(tmp_path / "mix")}, max_duration=4)
    assert main([str(cfg)]) == 0
    got = records(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert all(r["train/batch_fingerprint"] == inspect_batch(str(cfg), step=r["step"]).batch_fingerprint for r in got)


@pytest.mark.parametrize(("first", "then"), [("ddp", "fsdp"), ("fsdp", "single")])
def test_checkpoints_move_between_strategies(tmp_path: Path, tokens: str, first: str, then: str) -> None:
    cfg = config(tmp_path, tokens, max_duration=3)
    assert main([str(cfg), f"--distributed_strategy={first}", "--stop_at=2"]) == 0
    assert main([str(cfg), f"--distributed_strategy={then}"]) == 0
    (tmp_path / "ref").mkdir()
    reference = config(tmp_path / "ref", tokens, max_duration=3)
    assert main([str(reference), f"--distributed_strategy={first}"]) == 0
    got, ref = records(tmp_path), records(tmp_path / "ref")
    assert [r["step"] for r in got] == [1, 2, 3]
    assert got[2]["train/batch_fingerprint"] == ref[2]["train/batch_fingerprint"]
    assert got[2]["train/loss"] == pytest.approx(ref[2]["train/loss"], rel=1e-5)


def test_refused_resume_keeps_the_runs_config(tmp_path: Path, tokens: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, tokens, seed=1)
    assert main([str(cfg), "--stop_at=1"]) == 0
    assert main([str(cfg), "--seed=5"]) == 2
    assert "seed 1 != 5 (the data order would change)" in capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["seed"] == 1, "a refused resume must not rewrite save_folder/config.yaml"


def test_reset_trainer_state_says_the_fresh_run_starts_at_step_1(
    tmp_path: Path, tokens: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(config(tmp_path, tokens, max_duration=1))]) == 0
    ft = config(tmp_path, tokens, "ft.yaml", save_folder=str(tmp_path / "ft"), max_duration=1)
    assert main([str(ft), f"--load_path={tmp_path / 'run' / 'step1'}", "--reset_trainer_state"]) == 0
    err = capsys.readouterr().err
    assert "(reset_trainer_state): a fresh run, first trained step 1" in err, err
    assert [json.loads(x)["step"] for x in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.parametrize(
    ("model", "key", "rows"), [({}, "model.vocab_size", 64), ({"embedding_size": 80}, "model.embedding_size", 80)]
)
def test_data_vocabulary_larger_than_the_embedding_is_refused(
    tmp_path: Path, tokens: str, model: dict[str, Any], key: str, rows: int
) -> None:
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "part-0.npy").write_bytes(Path(tokens).read_bytes())
    manifest = {
        "format": "olmo-data.tokens",
        "version": 1,
        "dtype": "uint16",
        "tokenizer": {"name": "big", "vocab_size": 100},
        "files": [{"path": "part-0.npy", "tokens": 30 * SEQ}],
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    model_cfg = {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ, **model}
    cfg = config(tmp_path, tokens, data={"paths": [str(directory)]}, model=model_cfg)
    expected = (
        rf"config key '{key}': the model has {rows} embedding rows, but .*tok/manifest.json says the data's "
        rf"tokenizer has vocab_size 100 \(token ids up to 99\); set {key} to at least 100"
    )
    with pytest.raises(DataError, match=expected):
        train(load_config(cfg))
    assert not (tmp_path / "run" / "config.yaml").exists()
    model_cfg["embedding_size"] = 128  # room for every id: trains
    assert main([str(config(tmp_path, tokens, data={"paths": [str(directory)]}, model=model_cfg))]) == 0


def test_trains_from_an_olmo_padded_order(tmp_path: Path, tokens: str) -> None:
    """OLMo pads its order to a multiple of the world size (8) with its own head; the trainer takes it, and each
    step trains the batch inspect-batch shows from that order."""
    from olmo_data.dataset.instances import open_dataset
    from olmo_data.dataset.order import build_order
    from olmo_data.run.batches import inspect_batch

    n = len(open_dataset([tokens], sequence_length=SEQ))
    assert n % 8
    order = build_order(n, 6198, 0).astype(np.uint32)
    padded = np.concatenate([order, order[: 8 - n % 8]])
    padded.tofile(tmp_path / "olmo_order.npy")
    cfg = config(
        tmp_path,
        tokens,
        max_duration=3,
        seed=6198,
        data={"paths": [tokens], "order_path": str(tmp_path / "olmo_order.npy")},
    )
    assert main([str(cfg)]) == 0
    for r in records(tmp_path):
        report = inspect_batch(str(cfg), step=r["step"], order=str(tmp_path / "olmo_order.npy"))
        assert r["train/batch_fingerprint"] == report.batch_fingerprint
    bad = np.concatenate([order, order[1 : 9 - n % 8]])
    bad.tofile(tmp_path / "olmo_order.npy")
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(DataError, match="are not its first"):
        train(load_config(str(cfg), []))
