"""A disk that fills up (or a quota, a read-only mount, no permission) during a run: one line naming the folder and
what was being written, nothing partial left to keep the disk full, and the same command, once space is freed,
finishes with the losses of a run that never failed. In one process (the trainer's `main`), with the refusal
injected into the writer, and on a real 1 MiB tmpfs when run as root."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from olmo_data.errors import DataError
from olmo_train.checkpoint import integrity, save, space
from olmo_train.distributed import Dist
from olmo_train.train import main
from olmo_train.train.metrics import MetricsLog

SEQ, GBS, STEPS = 16, 4, 6


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tokens") / "tokens.npy"
    np.random.default_rng(0).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(path)
    return str(path)


def config(tmp: Path, tokens: str, folder: Path | None = None, **overrides: Any) -> str:
    cfg: dict[str, Any] = {
        "save_folder": str(folder or tmp / "run"),
        "seed": 5,
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": 2,
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
        "data": {"paths": [tokens]},
    }
    cfg.update(overrides)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def losses(run: Path) -> list[float]:
    return [json.loads(x)["train/loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def unbroken(tokens: str, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The losses of a run that never failed."""
    tmp = tmp_path_factory.mktemp("unbroken")
    assert main([config(tmp, tokens, save_interval_unsharded=2)]) == 0
    return losses(tmp / "run")


def refuse_writes_of(monkeypatch: pytest.MonkeyPatch, suffix: str, inside: str) -> None:
    """The disk fills up while a file ending in `suffix` under `inside` is written: some of its bytes land, then
    the write is refused (every file of a checkpoint passes through this stream, DCP's shards included)."""
    real_write = integrity._HashingStream.write

    def write(self: integrity._HashingStream, data: Any) -> int:
        name = str(getattr(self._raw, "name", ""))
        if inside in name and name.endswith(suffix):
            real_write(self, bytes(memoryview(data).cast("B")[:7]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(integrity._HashingStream, "write", write)


def only_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("kind", "suffix", "what", "last", "resumed"),
    [
        ("sharded", ".distcp", "the model and optimizer shards of step4", "step2", "step2"),
        # the size of the last checkpoint of the kind; step 4's sharded save came first and is the one resumed
        ("unsharded", "optim.pt", "optim.pt of step4-unsharded", "step2-unsharded", "step4"),
    ],
)
def test_a_full_disk_during_a_save_is_one_line_and_the_rerun_finishes_the_same(
    kind: str,
    suffix: str,
    what: str,
    last: str,
    resumed: str,
    tokens: str,
    unbroken: list[float],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    cfg = config(tmp_path, tokens, save_interval_unsharded=2)
    run = tmp_path / "run"
    refuse_writes_of(monkeypatch, suffix, f".tmp-step4{'-unsharded' if kind == 'unsharded' else ''}/")
    capfd.readouterr()
    assert main([cfg]) == 2
    line = only_error_line(capfd.readouterr().err)
    assert line.startswith(f"error: {run}: the disk is full (No space left on device) while writing {what}; ")
    assert "the partial checkpoint was removed" in line and "is free now" in line
    assert f"the last checkpoint ({last}) takes " in line and f"it resumes from {resumed})" in line
    assert not list(run.glob(".tmp-*")), "the partial checkpoint keeps the disk full"
    assert not (run / "step4-unsharded").exists() and os.readlink(run / "latest-unsharded") == "step2-unsharded"
    monkeypatch.undo()  # space freed
    assert main([cfg]) == 0
    assert losses(run) == unbroken


def test_a_full_disk_on_a_real_tmpfs(
    tokens: str, unbroken: list[float], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Root only (a tmpfs mount): the run fills a 1 MiB disk with checkpoints, exits with the line, and finishes
    the same once old checkpoints are deleted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        run = disk / "run"
        cfg = config(tmp_path, tokens, folder=run, save_interval=1, save_interval_unsharded=2)
        capfd.readouterr()
        assert main([cfg]) == 2
        err = capfd.readouterr().err
        line = only_error_line(err)
        assert line.startswith(f"error: {run}: the disk is full (No space left on device) while writing "), line
        assert not list(run.glob(".tmp-*"))
        last = line.rpartition("it resumes from ")[2].rstrip(")")
        assert (run / last / "trainer_state.json").is_file()
        assert "this save may fail for want of space" in err, "no warning before the save that failed"
        for old in run.glob("step*"):
            if old.name != last:
                shutil.rmtree(old)
        assert main([cfg, "--save_interval=100", "--save_interval_unsharded=100"]) == 0
        assert losses(run) == unbroken
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_writing_metrics_is_one_line(
    tokens: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    real_start = MetricsLog.start

    class FullDisk:
        closed = False

        def write(self, text: str) -> int:
            if '"step": 3' in text:
                raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
            return len(text)

        def flush(self) -> None: ...

        def close(self) -> None:
            FullDisk.closed = True
            raise OSError(errno.EDQUOT, "its unwritten buffer is refused again")

    def start(self: MetricsLog, resume_step: int) -> None:
        real_start(self, resume_step)
        self._file.close()
        self._file = FullDisk()

    monkeypatch.setattr(MetricsLog, "start", start)
    capfd.readouterr()
    assert main([config(tmp_path, tokens)]) == 2
    line = only_error_line(capfd.readouterr().err)
    run = tmp_path / "run"
    assert line.startswith(f"error: {run}: the disk quota is exceeded (Disk quota exceeded) while writing "), line
    assert "metrics.jsonl (step 3)" in line and "it resumes from step2" in line
    assert FullDisk.closed


def test_refusals_are_found_however_torch_wraps_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert space.refusal(full, tmp_path) == errno.ENOSPC
    try:  # torch.save into a stream: the zip writer's error, the OSError as its context
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as e:
        wrapped = e
    wrapped.__suppress_context__ = False
    assert space.refusal(wrapped, tmp_path) == errno.ENOSPC
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    dcp_error = CheckpointException("write", {1: _wrap_exception(OSError(errno.EROFS, "Read-only file system"))})
    assert space.refusal(dcp_error, tmp_path) == errno.EROFS
    assert space.refusal(PermissionError(errno.EACCES, "Permission denied"), tmp_path) == errno.EACCES
    # torch writing to a path itself keeps no OSError: the words and a nearly full disk tell
    bare = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(space, "free_bytes", lambda folder: 4096)
    assert space.refusal(bare, tmp_path) == errno.ENOSPC
    monkeypatch.setattr(space, "free_bytes", lambda folder: 100 << 30)
    assert space.refusal(bare, tmp_path) is None, "a serializer error on a roomy disk is not a full disk"
    assert space.refusal(OSError(errno.EIO, "I/O error"), tmp_path) is None
    assert space.refusal(ValueError("no"), tmp_path) is None


def test_a_warning_before_a_save_that_may_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    last = tmp_path / "step2"
    last.mkdir()
    (last / "model.pt").write_bytes(b"w" * 5000)
    (last / "trainer_state.json").write_text("{}")
    monkeypatch.setattr(space, "free_bytes", lambda folder: 3000)
    with caplog.at_level(logging.WARNING):
        space.warn_if_short(tmp_path, unsharded=False)
    assert f"{tmp_path}: 2.9 KiB free, less than the last checkpoint (step2) took (4.9 KiB)" in caplog.text
    caplog.clear()
    monkeypatch.setattr(space, "free_bytes", lambda folder: 1 << 30)
    space.warn_if_short(tmp_path, unsharded=False)
    assert not caplog.text


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[str]:
    """`path` made unwritable: a read-only tmpfs mounted on it as root (root ignores permissions), else no write
    permission; yields the meaning the message should give."""
    if os.geteuid() != 0:
        path.chmod(0o500)
        try:
            yield "permission denied (Permission denied)"
        finally:
            path.chmod(0o700)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield "the file system is read-only (Read-only file system)"
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_save_folder_that_cannot_be_written_is_one_line(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with unwritable(run) as meaning:
        capfd.readouterr()
        assert main([config(tmp_path, tokens, folder=run)]) == 2
        line = only_error_line(capfd.readouterr().err)
    # the first write there is the writer's lock (checkpoint/lock.py), which says what it could not do
    assert line.startswith(f"error: {run / 'writer.lock'}: cannot take the save folder's lock ("), line
    assert meaning.split(" (")[1].rstrip(")") in line and line.endswith("is save_folder writable?"), line


def test_a_save_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, tokens: str, capfd: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    run = parent / "run"
    with unwritable(parent) as meaning:
        capfd.readouterr()
        assert main([config(tmp_path, tokens, folder=run)]) == 2
        line = only_error_line(capfd.readouterr().err)
    assert line.startswith(f"error: {run}: {meaning} while writing the save folder"), line
    assert not run.exists()


def test_torch_save_into_a_refusing_stream_keeps_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the detection relies on: torch.save through our hashing stream leaves the OSError in the chain."""
    refuse_writes_of(monkeypatch, "x.pt", str(tmp_path))
    with pytest.raises(BaseException) as caught:
        integrity.Recorder(tmp_path).torch_save({"t": torch.zeros(1000)}, "x.pt")
    assert space.refusal(caught.value, tmp_path) == errno.ENOSPC


def test_the_next_start_removes_what_a_killed_save_left(tmp_path: Path) -> None:
    """A partial checkpoint, a link and atomic writes cut short by a kill: all go at the next start (they may be
    what fills the disk); complete checkpoints and other files stay."""
    (tmp_path / ".tmp-step4" / "rng").mkdir(parents=True)
    (tmp_path / ".tmp-step4" / "__0_0.distcp").write_bytes(b"x" * 100)
    (tmp_path / ".tmp-metrics.jsonl.k2j3h4").write_text("{}\n")
    (tmp_path / ".tmp-latest").symlink_to("step4")
    (tmp_path / "step2").mkdir()
    (tmp_path / "step2" / "trainer_state.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    save.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "step2"]


def test_a_full_disk_writing_the_data_order_is_one_line(
    tokens: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from olmo_data.dataset import order

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(order, "write_order", full)
    capfd.readouterr()
    assert main([config(tmp_path, tokens)]) == 2
    line = only_error_line(capfd.readouterr().err)
    run = tmp_path / "run"
    assert line.startswith(f"error: {run}: the disk is full (No space left on device) while writing the data order "), (
        line
    )
    assert "train_data/global_indices.npy; " in line and "(it starts afresh)" in line


def test_a_save_that_fails_otherwise_keeps_its_error_and_leaves_nothing_partial(tmp_path: Path) -> None:
    single = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    tmp = tmp_path / ".tmp-step4"
    guard = space.SaveGuard(tmp_path, "step4", tmp, single, unsharded=False)

    def fails(error: Exception) -> None:
        (tmp / "rng").mkdir(parents=True)
        raise error

    with pytest.raises(ValueError, match="a bug"):
        guard.together(lambda: fails(ValueError("a bug")))
    assert not tmp.exists()
    with pytest.raises(DataError, match="bad input"):
        guard.together(lambda: fails(DataError("bad input")))
    assert not tmp.exists()
    guard.what = "optim.pt"
    with pytest.raises(DataError, match=r"quota is exceeded .* while writing optim.pt of step4; the partial"):
        guard.together(lambda: fails(OSError(errno.EDQUOT, "Disk quota exceeded")))
    assert not tmp.exists()
    assert guard.together(lambda: 7) == 7
