"""`save_async: true`: sharded checkpoints written in the background. The guarantees are those of a synchronous
save: the resumed run is bitwise the unstopped one, every checkpoint passes `verify`, and a kill while a save is
in flight resumes from the last complete checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from olmo_train.checkpoint import PAUSE_AT_ENV, PAUSE_ENV, list_checkpoints, verify_checkpoint
from tests.train.test_train_e2e import (
    STEPS,
    check_same_run,
    kill_during_save,
    launch,
    resume_after_kill,
    tiny_config,
    write_tokens,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_tokens(tmp_path_factory.mktemp("tokens"))


def files_of(checkpoint: Path) -> list[str]:
    return sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file())


@pytest.mark.slow
def test_async_stop_and_resume_is_the_synchronous_run(data: list[str], tmp_path: Path) -> None:
    """2 processes, FSDP on gloo: a synchronous run in one go against an asynchronous one stopped at step 3 (the
    stop's save waited for) and resumed. Same losses bit for bit, the same checkpoints with the same files, each
    passing verify."""
    (tmp_path / "sync").mkdir()
    launch(tiny_config(tmp_path / "sync", data), 2)
    reference = tmp_path / "sync" / "run"
    config = tiny_config(tmp_path, data, save_async=True)
    first = launch(config, 2, "--stop_at=3")
    assert "in the background" in first.stdout + first.stderr
    run = tmp_path / "run"
    assert os.readlink(run / "latest") == "step3", "the stop's save completed before the run exited"
    launch(config, 2)
    check_same_run(reference, run, bitwise=True)
    assert os.readlink(run / "latest") == f"step{STEPS}"
    saved = [(step, path.name) for step, _, path in list_checkpoints(run)]
    assert [s for s, _ in saved] == [2, 3, 4, 6]
    for _, name in saved:
        assert "checkpoint of step" in verify_checkpoint(str(run / name), strict=True)
    assert files_of(run / "step4") == files_of(reference / "step4")
    assert not list(run.glob(".tmp-*"))


@pytest.mark.slow
def test_kill_while_a_save_is_in_flight_resumes_from_the_last_complete(data: list[str], tmp_path: Path) -> None:
    """One process. The step-4 save's shards are written (the background thread paused before the loop completes
    it) while the loop trains on; killed there, the rerun removes `.tmp-step4`, resumes from step 2 and trains
    what an unbroken synchronous run trained."""
    (tmp_path / "sync").mkdir()
    launch(tiny_config(tmp_path / "sync", data, distributed_strategy="single"), 1)
    config = tiny_config(tmp_path, data, distributed_strategy="single", save_async=True)
    run = tmp_path / "run"
    launch(config, 1, "--stop_at=2")
    kill_during_save(config, {PAUSE_ENV: "120", PAUSE_AT_ENV: "background"}, run)
    assert (run / ".tmp-step4").is_dir(), "the kill hit a save in flight"
    assert os.readlink(run / "latest") == "step2"
    resume_after_kill(config, run, tmp_path / "sync" / "run")
    assert "checkpoint of step 4" in verify_checkpoint(str(run / "step4"), strict=True)


@pytest.mark.slow
def test_async_with_unsharded_saves_only_keeps_them_synchronous(data: list[str], tmp_path: Path) -> None:
    """save_async is accepted with distributed_strategy single and unsharded checkpoints only: those are written
    synchronously as ever (nothing is left in flight), and a stop between them saves a sharded one in the
    background, completed before the run exits."""
    config = tiny_config(tmp_path, data, distributed_strategy="single", save_async=True, save_interval=None)
    run = tmp_path / "run"
    out = launch(config, 1, "--save_interval_unsharded=2", "--stop_at=3")
    assert "in the background" in out.stdout + out.stderr  # the stop's sharded save
    assert [(s, u) for s, u, _ in list_checkpoints(run)] == [(2, True), (3, False)]
    for _, _, path in list_checkpoints(run):
        assert "checkpoint of step" in verify_checkpoint(str(path), strict=True)
    assert os.readlink(run / "latest") == "step3"
    assert not list(run.glob(".tmp-*"))
