"""One writer per save folder (issue 26): the lock file a run holds in its save folder, in one process. Who is
refused and with what message, which stale locks are taken over (dead pid on this host, a requeued Slurm job, an
old heartbeat), that of racing launches exactly one wins, that the heartbeat moves and that a run gives back only
its own lock. The runs themselves (a second launch beside a live one) are in tests/train/test_one_writer.py."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from olmo_data.errors import DataError
from olmo_train.checkpoint import WRITER_LOCK, SaveFolderLock


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped: no process has it (until the system reuses it)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stamp(seconds_ago: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


def write_lock(folder: Path, **fields: Any) -> dict[str, Any]:
    holder: dict[str, Any] = {
        "host": "gpu-node-17",
        "pid": 4242,
        "slurm_job_id": None,
        "slurm_restart_count": 0,
        "started": stamp(3600),
        "heartbeat": stamp(5),
        "token": "0123456789abcdef",
    }
    holder.update(fields)
    (folder / WRITER_LOCK).write_text(json.dumps(holder))
    return holder


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_the_lock_names_its_holder_and_a_second_one_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "5150")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    first = SaveFolderLock(tmp_path, timeout_s=600)
    first.acquire()
    held = json.loads((tmp_path / WRITER_LOCK).read_text())
    assert held["host"] == socket.gethostname() and held["pid"] == os.getpid()
    assert held["slurm_job_id"] == "5150" and held["slurm_restart_count"] == 2
    assert datetime.fromisoformat(held["heartbeat"]) >= datetime.fromisoformat(held["started"])
    second = SaveFolderLock(tmp_path, timeout_s=600)
    with pytest.raises(DataError) as e:
        second.acquire()
    message = str(e.value)
    assert message.startswith(f"{tmp_path}: another run is writing to this save folder (host {socket.gethostname()}")
    assert f"pid {os.getpid()}, Slurm job 5150 (restart 2), since {held['started']}, last heartbeat " in message
    assert "use another save_folder" in message and f"delete {tmp_path / WRITER_LOCK}" in message
    assert "\n" not in message
    first.release()
    assert not (tmp_path / WRITER_LOCK).exists()
    second.acquire()  # free again once released
    second.release()
    first.release()  # twice: nothing happens


def test_a_live_holder_on_another_host_is_refused(tmp_path: Path) -> None:
    write_lock(tmp_path, heartbeat=stamp(30))
    with pytest.raises(DataError, match=r"another run is writing to this save folder \(host gpu-node-17, pid 4242, "):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert json.loads((tmp_path / WRITER_LOCK).read_text())["host"] == "gpu-node-17", "left as it was"


def test_a_dead_holder_on_this_host_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid = dead_pid()
    write_lock(tmp_path, host=socket.gethostname(), pid=pid, heartbeat=stamp(1))
    lock = SaveFolderLock(tmp_path, timeout_s=600)
    with caplog.at_level(logging.WARNING):
        lock.acquire()
    assert f"from a run that is gone (no such process on this host): host {socket.gethostname()}, pid {pid}," in (
        caplog.text
    )
    assert json.loads((tmp_path / WRITER_LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing left beside it"


def test_a_holder_silent_past_the_timeout_is_taken_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_lock(tmp_path, heartbeat=stamp(700))
    with caplog.at_level(logging.WARNING):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert re.search(
        r"\(no heartbeat for 70\ds, more than save_folder_lock_timeout_s \(600s\)\): host gpu-node-17, pid 4242",
        caplog.text,
    )
    write_lock(tmp_path, heartbeat=stamp(700))  # the same age under a longer timeout: alive
    with pytest.raises(DataError, match=r"last heartbeat 70\ds ago"):
        SaveFolderLock(tmp_path, timeout_s=900).acquire()


def test_a_requeued_slurm_job_takes_over_its_earlier_self(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_lock(tmp_path, slurm_job_id="77", slurm_restart_count=1)  # on another node, a fresh heartbeat
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the same incarnation: a second launch inside the job
    with pytest.raises(DataError, match=r"Slurm job 77 \(restart 1\)"):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # another job: no claim on it
    with pytest.raises(DataError, match=r"Slurm job 77"):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with caplog.at_level(logging.WARNING):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert "(Slurm requeued the job (restart 2)): host gpu-node-17" in caplog.text


def take(lock: SaveFolderLock, start: threading.Barrier, outcomes: list[str]) -> None:
    start.wait()
    try:
        lock.acquire()
        outcomes.append("won")
    except DataError as e:
        outcomes.append(str(e))


def test_of_racing_launches_exactly_one_wins(tmp_path: Path) -> None:
    """Eight launches at once on a free folder, and eight at once on a dead holder's lock: one lock each time."""
    for stale in (False, True):
        if stale:
            write_lock(tmp_path, host=socket.gethostname(), pid=dead_pid())
        locks = [SaveFolderLock(tmp_path, timeout_s=600) for _ in range(8)]
        start = threading.Barrier(len(locks))
        outcomes: list[str] = []
        threads = [threading.Thread(target=take, args=(lock, start, outcomes)) for lock in locks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count("won") == 1, outcomes
        assert all("another run is writing" in o for o in outcomes if o != "won"), outcomes
        winner = next(lock for lock in locks if lock.holder is not None)
        assert json.loads((tmp_path / WRITER_LOCK).read_text())["token"] == winner.holder.token  # type: ignore[union-attr]
        winner.release()
        assert list(tmp_path.iterdir()) == []


def test_the_heartbeat_moves_while_held_and_stops_when_released(tmp_path: Path) -> None:
    lock = SaveFolderLock(tmp_path, timeout_s=10)  # a beat every second
    lock.acquire()
    first = json.loads((tmp_path / WRITER_LOCK).read_text())
    time.sleep(2.5)  # the stamps have 1 s resolution
    later = json.loads((tmp_path / WRITER_LOCK).read_text())
    assert later["heartbeat"] > first["heartbeat"] and later["started"] == first["started"]
    lock.release()
    assert lock._thread is not None and not lock._thread.is_alive()


def test_a_run_gives_back_only_its_own_lock(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run silent past the timeout (suspended) whose lock another launch took over: its release leaves the new
    holder's lock in place, and its heartbeat says what happened instead of writing over it."""
    lock = SaveFolderLock(tmp_path, timeout_s=1)  # a beat every 0.1 s
    lock.acquire()
    other = write_lock(tmp_path, heartbeat=stamp(0))
    with caplog.at_level(logging.ERROR):
        time.sleep(0.5)
    assert "was taken over by another run (host gpu-node-17, pid 4242" in caplog.text
    lock.release()
    assert json.loads((tmp_path / WRITER_LOCK).read_text()) == other


def test_a_damaged_lock_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / WRITER_LOCK).write_text('{"host": "a"')
    with pytest.raises(DataError, match=rf"{WRITER_LOCK}: not a save-folder lock this trainer wrote .*delete the file"):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()


def test_a_disabled_lock_is_a_no_op(tmp_path: Path) -> None:
    """Ranks other than 0 hold no lock: only rank 0 takes it, and tells the others the outcome."""
    write_lock(tmp_path)
    lock = SaveFolderLock(tmp_path, timeout_s=600, enabled=False)
    lock.acquire()
    lock.release()
    assert (tmp_path / WRITER_LOCK).exists()


def test_a_zombie_holder_counts_as_dead(tmp_path: Path) -> None:
    """A rank killed with its launcher stays a zombie where nothing reaps orphans: its pid exists, its run does
    not."""
    proc = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while "Z" not in Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0]:
        assert time.time() < deadline
        time.sleep(0.01)
    try:
        write_lock(tmp_path, host=socket.gethostname(), pid=proc.pid)
        lock = SaveFolderLock(tmp_path, timeout_s=600)
        lock.acquire()
        lock.release()
    finally:
        proc.wait()


def test_a_full_disk_is_one_line_and_leaves_no_empty_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock file is created, then its write fails: it is removed again (an empty one would refuse the next
    launch as damaged), and the failure is a DataError, which stops every rank together."""

    class FullDisk(io.BytesIO):
        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd: int, mode: str) -> FullDisk:
        os.close(fd)
        return FullDisk()

    monkeypatch.setattr("olmo_train.checkpoint.lock.os.fdopen", fdopen)
    with pytest.raises(DataError, match=rf"{WRITER_LOCK}: cannot take the save folder's lock \(.*No space left"):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pid", [2**70, 2**40])
def test_a_pid_no_process_can_have_is_taken_over(tmp_path: Path, pid: int, caplog: pytest.LogCaptureFixture) -> None:
    write_lock(tmp_path, host=socket.gethostname(), pid=pid, heartbeat=stamp(1))
    with caplog.at_level(logging.WARNING):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert f"(no such process on this host): host {socket.gethostname()}, pid {pid}," in caplog.text


@pytest.mark.parametrize("pid", [0, -1, True])
def test_a_pid_that_names_no_single_process_is_refused_naming_the_file(tmp_path: Path, pid: int) -> None:
    """0 and negative pids name process groups to os.kill (0: our own, which is alive): not a holder's pid."""
    write_lock(tmp_path, host=socket.gethostname(), pid=pid)
    with pytest.raises(DataError, match=rf"^{tmp_path / WRITER_LOCK}: not a save-folder lock this trainer wrote"):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()


def test_a_heartbeat_in_the_future_is_aged_by_the_files_own_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder whose clock runs ahead: its age is never shown negative, and once the file itself has not been
    rewritten for the timeout (measured on this clock), it is taken over like any silent holder."""
    write_lock(tmp_path, heartbeat=stamp(-86400 * 365))
    with pytest.raises(DataError) as refused:
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert "ago" in str(refused.value) and "-" not in str(refused.value).split("last heartbeat ")[1].split("s ")[0]
    assert "in the future" in str(refused.value)
    old = time.time() - 700
    os.utime(tmp_path / WRITER_LOCK, (old, old))
    with caplog.at_level(logging.WARNING):
        SaveFolderLock(tmp_path, timeout_s=600).acquire()
    assert re.search(r"no heartbeat for 70\ds, more than save_folder_lock_timeout_s", caplog.text), caplog.text
