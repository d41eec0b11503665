"""One writer per save folder (issue 26): a second launch beside a live run is refused at once naming the run, a
lock left by a dead run is taken over and the run completes, a stopped or failed run gives the folder back, and
metrics.jsonl is only ever appended to (what a start cannot continue is set aside whole, never cut). The lock file
itself is tested in tests/checkpoint/test_lock.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_train.checkpoint import WRITER_LOCK
from olmo_train.train import MetricsLog, main
from tests.train.test_train_e2e import REPO, launch, tiny_config, write_tokens
from tests.train.test_train_loop import SEQ, config


@pytest.fixture()
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(path)  # 30 instances
    return str(path)


def steps(run: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (run / name).read_text().splitlines()]


def stamp(seconds_ago: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


def write_lock(run: Path, **fields: Any) -> None:
    holder: dict[str, Any] = {
        "host": "gpu-node-17",
        "pid": 4242,
        "slurm_job_id": "31337",
        "slurm_restart_count": 0,
        "started": stamp(7200),
        "heartbeat": stamp(5),
        "token": "0123456789abcdef",
    }
    run.mkdir(parents=True, exist_ok=True)
    (run / WRITER_LOCK).write_text(json.dumps({**holder, **fields}))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_a_dead_runs_lock_is_taken_over_and_the_run_completes(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    pid = dead_pid()
    write_lock(run, host=socket.gethostname(), pid=pid)
    assert main([str(config(tmp_path, tokens))]) == 0
    err = capfd.readouterr().err
    assert f"took over the save folder lock {run / WRITER_LOCK} from a run that is gone (no such process on " in err
    assert f"host {socket.gethostname()}, pid {pid}, Slurm job 31337 (restart 0), since " in err
    assert steps(run) == [1, 2, 3]
    assert not (run / WRITER_LOCK).exists(), "given back at the end"


def test_a_lock_with_an_old_heartbeat_is_taken_over_after_the_configured_time(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A holder on another host, silent for two minutes: alive under the default limit (600 s), so the launch is
    refused with one line and writes nothing; dead under a limit of 60 s, so it is taken over."""
    run = tmp_path / "run"
    write_lock(run, heartbeat=stamp(120))
    cfg = config(tmp_path, tokens)
    assert main([str(cfg)]) == 2
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {run}: another run is writing to this save folder (host gpu-node-17, pid 4242")
    assert "Slurm job 31337 (restart 0), since " in lines[0] and "last heartbeat 12" in lines[0]
    assert "save_folder_lock_timeout_s, 600s" in lines[0]
    assert sorted(p.name for p in run.iterdir()) == [WRITER_LOCK], "the refused launch wrote nothing"
    assert main([str(cfg), "--save_folder_lock_timeout_s=60"]) == 0
    err = capfd.readouterr().err
    assert "from a run that is gone (no heartbeat for 12" in err and "more than save_folder_lock_timeout_s (60s)" in err
    assert steps(run) == [1, 2, 3] and not (run / WRITER_LOCK).exists()


def test_the_folder_is_given_back_after_a_stop_an_error_and_the_end(tmp_path: Path, tokens: str) -> None:
    cfg = config(tmp_path, tokens)
    run = tmp_path / "run"
    assert main([str(cfg), "--stop_at=1"]) == 0
    assert not (run / WRITER_LOCK).exists()
    assert main([str(cfg), "--global_train_batch_size=2"]) == 2  # refused on resume (other batch size): an error
    assert not (run / WRITER_LOCK).exists()
    assert main([str(cfg)]) == 0  # resumes at step 2
    assert not (run / WRITER_LOCK).exists()
    assert main([str(cfg)]) == 0  # nothing to train
    assert not (run / WRITER_LOCK).exists()
    assert steps(run) == [1, 2, 3]
    assert not list(run.glob("metrics.*.jsonl")), "each start continued the file"


def test_a_fresh_run_sets_an_earlier_runs_metrics_aside(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A save folder with another run's metrics.jsonl and no checkpoint (deleted, or the run was killed before its
    first save): the new run starts at step 1, and the old file is kept whole under a new name."""
    run = tmp_path / "run"
    run.mkdir()
    old = b'{"step": 1, "train/loss": 9.0}\n{"step": 2, "train/loss": 8.0}\n{"step": 3, "trai'
    (run / "metrics.jsonl").write_bytes(old)
    assert main([str(config(tmp_path, tokens))]) == 0
    assert (run / "metrics.1.jsonl").read_bytes() == old
    assert steps(run) == [1, 2, 3]
    err = capfd.readouterr().err
    assert (
        f"{run / 'metrics.jsonl'} holds an earlier run's records, and this run starts at step 1: kept whole as " in err
    )
    assert "kept whole as metrics.1.jsonl; metrics.jsonl starts empty" in err


def test_a_resume_behind_the_metrics_sets_them_aside_and_logs_each_step_once(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Killed after logging step 3 and before its checkpoint was complete: the resume from step 2 trains step 3
    again. metrics.jsonl reads as one run (steps 1, 2, 3 once each), and the first step 3 is still on disk."""
    cfg = config(tmp_path, tokens)
    run = tmp_path / "run"
    assert main([str(cfg)]) == 0
    shutil.rmtree(run / "step3")
    before = (run / "metrics.jsonl").read_bytes()
    assert main([str(cfg)]) == 0
    assert (run / "metrics.1.jsonl").read_bytes() == before
    now = (run / "metrics.jsonl").read_bytes()
    assert steps(run) == [1, 2, 3]
    assert now.splitlines()[:2] == before.splitlines()[:2], "steps 1 and 2 copied as they were"
    err = capfd.readouterr().err
    assert (
        "holds records past step 2, where this run resumes (or a line cut short): kept whole as metrics.1.jsonl; "
        in err
    )
    assert "kept whole as metrics.1.jsonl; metrics.jsonl keeps steps 1..2 and continues" in err


def test_metrics_that_a_start_continues_are_appended_to_in_place(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    inode = path.stat().st_ino
    log = MetricsLog(path, enabled=True)
    log.start(2)
    log.write({"step": 3})
    log.close()
    assert path.stat().st_ino == inode and steps(tmp_path) == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    for _ in range(2):  # a fresh start each time: metrics.1.jsonl, then metrics.2.jsonl, each kept
        log = MetricsLog(path, enabled=True)
        log.start(0)
        log.write({"step": 1})
        log.close()
        assert steps(tmp_path) == [1]
    assert steps(tmp_path, "metrics.1.jsonl") == [1, 2, 3] and steps(tmp_path, "metrics.2.jsonl") == [1]


@pytest.mark.slow
def test_a_second_launch_beside_a_live_run_is_refused_naming_it(tmp_path: Path) -> None:
    """A run trains (one process); a second launch on its save folder (torchrun, 2 processes) is refused on every
    rank before writing anything, naming the first. The first then stops (SIGTERM: saved and given back), and
    its metrics.jsonl holds every step once; the next launch resumes it."""
    data = write_tokens(tmp_path / "tokens")
    cfg = tiny_config(tmp_path, data, distributed_strategy="single", save_interval=1000)
    run = tmp_path / "run"
    first = launch(cfg, 1, "--max_duration=100000", wait=False)
    assert isinstance(first, subprocess.Popen)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 2:
            assert first.poll() is None, first.communicate()[0]
            assert time.time() < deadline, "the first run never trained"
            time.sleep(0.2)
        t0 = time.time()
        second = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "olmo_train"]
            + [str(cfg), "--max_duration=100000", "--distributed_strategy=fsdp"],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            text=True,
            capture_output=True,
            timeout=180,
        )
        refused_in = time.time() - t0
        assert second.returncode != 0
        lines = [x for x in second.stderr.splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith("error:")]
        assert len(errors) == 1, second.stderr  # printed by rank 0 only
        host = socket.gethostname()
        assert errors[0].startswith(
            f"error: {run}: another run is writing to this save folder (host {host}, pid {first.pid}, since "
        ), second.stderr
        assert "last heartbeat " in errors[0] and "use another save_folder" in errors[0]
        assert sum(x.strip().startswith("traceback : error: ") for x in lines) == 2, "both ranks stopped"
        assert "model:" not in second.stderr, "refused before building anything"
        assert refused_in < 120
        assert first.poll() is None, "the first run goes on"
        assert json.loads((run / WRITER_LOCK).read_text())["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output
    last = steps(run)[-1]
    assert steps(run) == list(range(1, last + 1)), "every step of the first run once"
    assert not (run / WRITER_LOCK).exists()
    launch(cfg, 1, f"--max_duration={last + 2}")
    assert steps(run) == list(range(1, last + 3))
    assert not list(run.glob("metrics.*.jsonl")), "nothing was ever set aside"
    assert not (run / WRITER_LOCK).exists()


def test_a_run_whose_lock_is_taken_over_stops_without_writing_again(tmp_path: Path) -> None:
    """A run silent past the timeout (suspended, say) whose folder another launch took over must not go on writing
    beside it: at its next step it stops on every rank, one line naming the new holder, and writes nothing more
    (no metrics record, no checkpoint), leaving the new holder's lock in place."""
    data = write_tokens(tmp_path / "tokens")
    cfg = tiny_config(tmp_path, data, distributed_strategy="single", save_interval=1000)
    run = tmp_path / "run"
    first = launch(cfg, 1, "--max_duration=100000", "--save_folder_lock_timeout_s=1", wait=False)
    assert isinstance(first, subprocess.Popen)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 2:
            assert first.poll() is None, first.communicate()[0]
            assert time.time() < deadline, "the run never trained"
            time.sleep(0.2)
        write_lock(run, heartbeat=stamp(0))  # the new holder (its pid need not live here: another host's)
        taken = json.loads((run / WRITER_LOCK).read_text())
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 2, output
    error = [x for x in output.splitlines() if x.startswith("error:")]
    assert len(error) == 1, output
    assert f"{run / WRITER_LOCK}: another run took this save folder over (host gpu-node-17, pid 4242" in error[0]
    assert "stopped at step" in error[0]
    stopped_at = int(error[0].split("stopped at step ")[1].split()[0])
    assert steps(run) == list(range(1, stopped_at)), "every step before it once, not the one it stopped at"
    assert not list(run.glob("step*")), "no checkpoint written"
    assert json.loads((run / WRITER_LOCK).read_text()) == taken
