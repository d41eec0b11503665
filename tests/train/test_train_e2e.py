"""End-to-end trainer runs on CPU (gloo), launched the way users launch them: torchrun with 2 processes, or
plain `python -m olmo_train`. Each run is a tiny model on a few steps; the checks are the trainer's
guarantees: a resumed run is bitwise the unstopped run, token counts and batch fingerprints survive resumes
and world-size changes, and a kill during a checkpoint write loses nothing that was complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
GBS, SEQ, STEPS = 8, 32, 6


def write_tokens(directory: Path) -> list[str]:
    """Two headerless uint16 token files: 40 instances of 32 tokens, so 5 batches per epoch and step 6 is in
    epoch 1. The first file repeats a pattern (learnable), the second is random."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    a = np.tile((np.arange(50) * 7) % 251, 16)[: 25 * SEQ].astype(np.uint16)
    b = rng.integers(0, 256, 15 * SEQ + 5).astype(np.uint16)  # 5 leftover tokens: dropped, as OLMo does
    paths = [directory / "a.npy", directory / "b.npy"]
    a.tofile(paths[0])
    b.tofile(paths[1])
    return [str(p) for p in paths]


def tiny_config(tmp: Path, data: list[str], **overrides: Any) -> Path:
    cfg: dict[str, Any] = {
        "run_name": "test",
        "seed": 3,
        "save_folder": str(tmp / "run"),
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "save_interval": 2,
        "distributed_strategy": "fsdp",
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
        "scheduler": {"name": "cosine_with_warmup", "t_warmup": 2},
        "data": {"paths": data},
    }
    cfg.update(overrides)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(
    config: Path, nproc: int, *overrides: str, env: dict[str, str] | None = None, wait: bool = True
) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    if nproc == 1:
        cmd = [sys.executable, "-m", "olmo_train", str(config), *overrides]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "olmo_train",
            str(config),
            *overrides,
        ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if not wait:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env=full_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def kill_during_save(config: Path, pause: dict[str, str], run: Path, step: int = 4) -> None:
    """Run `config` in one process with the save pause hook set by `pause`, and kill -9 it (and its process group)
    once the save of `step` has paused where the hook says."""
    proc = launch(config, 1, env=pause, wait=False)
    assert isinstance(proc, subprocess.Popen)
    marker = run / f"step{step}.saving"
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, f"the trainer never reached the step-{step} save"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def resume_after_kill(config: Path, run: Path, reference: Path) -> list[dict[str, Any]]:
    """Rerun `config` after `kill_during_save` hit the step-4 save: the partial checkpoint is removed, the run
    resumes from step 2 and logs every step once, with the losses of `reference` (an unbroken run); returns its
    metrics."""
    out = launch(config, 1)
    text = out.stdout + out.stderr
    assert "resuming from" in text and "step2" in text
    assert not (run / ".tmp-step4").exists()
    got = metrics(run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [r["train/tokens_seen"] for r in got] == [s * GBS * SEQ for s in range(1, STEPS + 1)]
    assert [r["train/loss"] for r in got] == [r["train/loss"] for r in metrics(reference)]
    return got


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path, step: int = STEPS) -> dict[str, Any]:
    return torch.load(run / f"step{step}-unsharded" / "model.pt", weights_only=True)


def expected_fingerprints(config: Path) -> dict[int, str]:
    """What `olmo-data inspect-batch CONFIG --step N` reports for each step (its library function)."""
    from olmo_data.run.batches import inspect_batch

    return {step: inspect_batch(str(config), step=step).batch_fingerprint for step in range(1, STEPS + 1)}


def cli_fingerprint(config: Path, step: int) -> str:
    """The fingerprint the `olmo-data inspect-batch` command prints (run as a user would)."""
    cmd = [sys.executable, "-m", "olmo_cli.main", "inspect-batch", str(config), "--step", str(step), "--json"]
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["batch_fingerprint"])


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_tokens(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="module")
def unstopped(data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-process FSDP run of all steps in one go: the reference for the resume tests."""
    tmp = tmp_path_factory.mktemp("unstopped")
    launch(tiny_config(tmp, data, save_interval_unsharded=STEPS), 2)
    return tmp / "run"


def check_same_run(reference: Path, resumed: Path, bitwise: bool) -> None:
    ref, got = metrics(reference), metrics(resumed)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), "each step exactly once in metrics.jsonl"
    for a, b in zip(ref, got, strict=True):
        assert a["train/batch_fingerprint"] == b["train/batch_fingerprint"]
        assert b["train/tokens_seen"] == b["step"] * GBS * SEQ
        assert a["train/tokens_seen"] == b["train/tokens_seen"]
        assert a["optim/lr"] == b["optim/lr"]
        if bitwise:
            assert a["train/loss"] == b["train/loss"], f"step {a['step']}"
        else:  # another world size sums in another order: equal up to rounding
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_stop_and_resume_is_bitwise_identical(strategy: str, data: list[str], tmp_path: Path, unstopped: Path) -> None:
    if strategy == "fsdp":
        reference = unstopped
    else:
        (tmp_path / "ref").mkdir()
        launch(tiny_config(tmp_path / "ref", data, distributed_strategy="ddp", save_interval_unsharded=STEPS), 2)
        reference = tmp_path / "ref" / "run"
    config = tiny_config(tmp_path, data, distributed_strategy=strategy, save_interval_unsharded=STEPS)
    launch(config, 2, "--stop_at=3")  # not a multiple of save_interval: the stop itself checkpoints
    run = tmp_path / "run"
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert (run / "step3" / "trainer_state.json").is_file()
    launch(config, 2)
    check_same_run(reference, run, bitwise=True)
    ref_w, got_w = final_weights(reference), final_weights(run)
    assert ref_w.keys() == got_w.keys()
    for key in ref_w:
        assert torch.equal(ref_w[key], got_w[key]), key
    state = json.loads((run / "latest-unsharded" / "trainer_state.json").read_text())
    assert state["step"] == STEPS and state["tokens_seen"] == STEPS * GBS * SEQ and state["epoch"] == 1
    # the fingerprints logged are those the data tools compute for the same steps (inspect-batch's definition)
    expected = expected_fingerprints(config)
    assert {r["step"]: r["train/batch_fingerprint"] for r in metrics(run)} == expected


@pytest.mark.slow
def test_world_size_changes_keep_data_and_token_counts(data: list[str], tmp_path: Path, unstopped: Path) -> None:
    """2 processes -> 1 process (from a sharded checkpoint) -> 2 processes (from an unsharded one)."""
    config = tiny_config(tmp_path, data)
    run = tmp_path / "run"
    launch(config, 2, "--stop_at=2")
    out = launch(config, 1, "--stop_at=4", "--save_interval=100", "--save_interval_unsharded=4")
    assert "written by 2 ranks; continuing on 1" in out.stderr + out.stdout
    assert (run / "step4-unsharded").is_dir() and not (run / "step4").exists()
    out = launch(config, 2)
    assert "resuming from" in out.stderr + out.stdout and "step4-unsharded" in out.stderr + out.stdout
    check_same_run(unstopped, run, bitwise=False)
    state = json.loads((run / "latest" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["tokens_seen"] == STEPS * GBS * SEQ


@pytest.fixture(scope="module")
def unstopped_single(data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-process run of all steps in one go: the reference for the kill tests."""
    tmp = tmp_path_factory.mktemp("unstopped-single")
    launch(tiny_config(tmp, data, distributed_strategy="single"), 1)
    return tmp / "run"


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["shards", "written", "checksums", "rename"])
def test_sigkill_during_checkpoint_write_keeps_previous(
    moment: str, data: list[str], tmp_path: Path, unstopped_single: Path
) -> None:
    """Killed inside the step-4 save: after the shards (before the RNG state), with every file written (before
    checksums.json), after checksums.json (before trainer_state.json), or complete but not yet renamed. The
    rerun removes the partial checkpoint, resumes from step 2 and trains what the unbroken run trained."""
    config = tiny_config(tmp_path, data, distributed_strategy="single")
    run = tmp_path / "run"
    launch(config, 1, "--stop_at=2")
    kill_during_save(config, {"OLMO_TRAIN_TEST_SAVE_PAUSE": "120", "OLMO_TRAIN_TEST_SAVE_PAUSE_AT": moment}, run)
    assert (run / ".tmp-step4").is_dir(), "the kill hit the write: a partial checkpoint exists"
    assert not (run / "step4").exists()
    assert os.readlink(run / "latest") == "step2"
    got = resume_after_kill(config, run, unstopped_single)
    if moment == "written":  # the fingerprints are the data tools' (once: they do not depend on the moment)
        assert got[-1]["train/batch_fingerprint"] == cli_fingerprint(config, STEPS)
        assert got[2]["train/batch_fingerprint"] == cli_fingerprint(config, 3)


@pytest.mark.slow
def test_a_disk_full_under_one_rank_ends_every_rank_with_one_line(
    data: list[str], tmp_path: Path, unstopped: Path
) -> None:
    """Rank 1's RNG state of the step-4 save is refused for want of space while rank 0's part succeeds: both ranks
    leave together (neither waits in the next collective) with the one line, no partial checkpoint is left, and
    the same command then finishes as the unbroken run."""
    config = tiny_config(tmp_path, data, save_interval_unsharded=STEPS)
    run = tmp_path / "run"
    script = REPO / "tests" / "train" / "full_disk_trainer.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FULL_DISK_RANK": "1", "FULL_DISK_STEP": "4"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([*cmd, str(config)], cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode != 0
    message = (
        f"error: {run}: the disk is full (No space left on device) while writing the RNG state rng/rank1.pt of "
        "step4; the partial checkpoint was removed; the last checkpoint (step2) takes "
    )
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, proc.stderr  # printed by rank 0 alone
    assert lines[0].startswith(message) and lines[0].endswith("(it resumes from step2)"), proc.stderr
    causes = [x.strip() for x in proc.stderr.splitlines() if x.strip().startswith("traceback : ")]
    assert causes == [f"traceback : {lines[0]}"] * 2, proc.stderr  # both ranks exited with it
    assert not list(run.glob(".tmp-*")) and not (run / "step4").exists()
    launch(config, 2)
    check_same_run(unstopped, run, bitwise=True)


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(data: list[str], tmp_path: Path) -> None:
    config = tiny_config(tmp_path, data, distributed_strategy="single", save_interval=1000)
    run = tmp_path / "run"
    proc = launch(config, 1, "--max_duration=100000", wait=False)
    assert isinstance(proc, subprocess.Popen)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "stop signal received" in output
    last = metrics(run)[-1]["step"]
    state = json.loads((run / "latest" / "trainer_state.json").read_text())
    assert state["step"] == last and state["tokens_seen"] == last * GBS * SEQ


@pytest.mark.slow
def test_a_config_error_under_torchrun_comes_first_once_and_ends_the_summary(tmp_path: Path) -> None:
    """Bad input under torchrun: the first line is our error (from rank 0 only), the launcher's failure summary
    repeats it as each rank's cause instead of pointing at its docs, and the exit status is non-zero."""
    config = tiny_config(tmp_path, [str(tmp_path / "missing.npy")])
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "olmo_train"]
        + [str(config)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    message = f"error: {tmp_path / 'missing.npy'}: token file not found; check data.paths"
    assert lines[0] == message, proc.stderr
    assert sum(x == message for x in lines) == 1  # printed by one rank, not by each
    assert sum(x.strip() == f"traceback : {message}" for x in lines) == 2  # the summary's cause, per rank
    assert "To enable traceback" not in proc.stderr


@pytest.mark.slow
def test_a_chunked_loss_trains_as_the_whole_one_under_fsdp(data: list[str], tmp_path: Path, unstopped: Path) -> None:
    """Chunks of 5 tokens (31 predictions per instance: uneven chunks), each recomputed in backward while FSDP2
    holds the output head gathered, give the run the reference (one chunk per micro-batch) gives."""
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ}
    launch(tiny_config(tmp_path, data, model={**model, "loss_chunk_tokens": 5}), 2)
    ref, got = metrics(unstopped), metrics(tmp_path / "run")
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    # step 1 starts from the same weights: the same loss and gradients up to the order of fp32 sums
    assert got[0]["train/loss"] == pytest.approx(ref[0]["train/loss"], rel=1e-6)
    assert got[0]["optim/grad_norm"] == pytest.approx(ref[0]["optim/grad_norm"], rel=1e-5)
    for a, b in zip(ref, got, strict=True):  # later steps: Adam carries those last-bit differences along
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-4), a["step"]
