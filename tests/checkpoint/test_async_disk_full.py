"""`save_async: true` on a disk that fills up: the background save of step 4 fills it, and the loop's next write
(metrics.jsonl at step 5) is refused before the save is waited for. The one line names the checkpoint, the real
cause, not metrics.jsonl; the in-flight `.tmp-step4` is removed (it held the space that is missing); the rerun,
space freed, finishes with the losses of a run that never failed."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from olmo_train.train import main
from olmo_train.train.metrics import MetricsLog
from tests.checkpoint.test_disk_full import config, losses, only_error_line, refuse_writes_of, tokens  # noqa: F401


def refuse_metrics_from(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """metrics.jsonl writes of `step` and later are refused (ENOSPC), as on a disk a save has just filled."""
    real_start = MetricsLog.start

    class Refusing:
        def __init__(self, file: Any) -> None:
            self.file = file

        def write(self, text: str) -> int:
            if any(f'"step": {s},' in text for s in range(step, 100)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return int(self.file.write(text))

        def flush(self) -> None:
            self.file.flush()

        def close(self) -> None:
            self.file.close()

    def start(self: MetricsLog, resume_step: int) -> None:
        real_start(self, resume_step)
        self._file = Refusing(self._file)

    monkeypatch.setattr(MetricsLog, "start", start)


def test_a_full_disk_under_an_async_save_names_the_save_and_removes_it(
    tokens: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    cfg = config(tmp_path, tokens, save_async=True)
    assert main([cfg]) == 0
    unbroken = losses(run)
    for p in run.iterdir():
        (os.remove if p.is_file() or p.is_symlink() else __import__("shutil").rmtree)(p)
    refuse_writes_of(monkeypatch, ".distcp", ".tmp-step4/")
    refuse_metrics_from(monkeypatch, 5)
    capfd.readouterr()
    assert main([cfg]) == 2
    line = only_error_line(capfd.readouterr().err)
    assert line.startswith(f"error: {run}: the disk is full (No space left on device) while writing the model and "), (
        line
    )
    assert "of step4" in line and "metrics.jsonl" not in line and "the partial checkpoint was removed" in line
    assert "it resumes from step2" in line
    assert not list(run.glob(".tmp-*")), "the in-flight save was left behind"
    monkeypatch.undo()
    assert main([cfg]) == 0
    assert losses(run) == unbroken


def test_an_async_save_on_a_real_full_tmpfs(
    tokens: str,  # noqa: F811
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Root only: background saves fill a 1 MiB tmpfs; one line names a checkpoint's writes, no `.tmp-step*`."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        run = disk / "run"
        capfd.readouterr()
        assert main([config(tmp_path, tokens, folder=run, save_interval=1, save_async=True)]) == 2
        line = only_error_line(capfd.readouterr().err)
        assert line.startswith(f"error: {run}: the disk is full (No space left on device) while writing "), line
        assert "metrics.jsonl" not in line and " of step" in line, line
        assert not list(run.glob(".tmp-*"))
    finally:
        subprocess.run(["umount", str(disk)], check=True)
