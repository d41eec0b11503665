"""One writer per save folder: the run writing to it holds `writer.lock`, and a second launch is refused at once.

Two runs on one save folder (a double `sbatch`, a requeued job overlapping the old one, a second terminal) would
both save stepN and `latest` over each other, and the second would remove the first's checkpoint in the making
as a leftover. So rank 0 takes the lock before anything is written into the folder and gives it back when the run
ends, however it ends short of being killed.

The lock is a small JSON file naming its holder: host, pid, Slurm job id and requeue count (SLURM_JOB_ID,
SLURM_RESTART_COUNT), when it started, and a heartbeat a daemon thread refreshes every `heartbeat_interval` seconds
(a thread, so a long save or evaluation does not look like a dead run). It is created with O_CREAT|O_EXCL, so of
two launches racing for it exactly one wins (racing to take over a dead holder's lock too: `_take_over`). A lock
left by a run that was killed is taken over, with a warning naming the old holder, once its holder is surely gone:
- on this host, no process has its pid;
- it is this very Slurm job, requeued (same SLURM_JOB_ID, a higher SLURM_RESTART_COUNT): the old incarnation
  cannot run beside its requeued self, wherever it ran;
- its heartbeat is older than `save_folder_lock_timeout_s` (a holder on another host that died with its node);
  this compares clocks of two hosts, which a cluster keeps in step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from olmo_data.errors import DataError, shown
from olmo_data.io import atomic_path, json_bytes
from olmo_train.checkpoint.layout import WRITER_LOCK

log = logging.getLogger(__name__)

TIMEOUT_KEY = "save_folder_lock_timeout_s"
TAKEOVER_SUFFIX = ".takeover"  # beside the lock while a launch replaces a dead holder's lock with its own


def heartbeat_interval(timeout_s: float) -> float:
    """A tenth of the timeout, at most a minute: a live holder refreshes about ten times before it could be taken
    for dead, and a large folder of runs is not rewritten more than once a minute each."""
    return min(60.0, timeout_s / 10)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _age_s(stamp: str) -> float:
    return time.time() - datetime.fromisoformat(stamp).timestamp()


def _pid_alive(pid: int) -> bool:
    """Whether a process of this pid runs here. A zombie does not: a rank killed with its launcher is left as one
    where nothing reaps orphans (a container whose first process is not an init)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # (a pid past what a pid can be: no process has it)
        return False
    except PermissionError:  # it exists, as another user's process
        pass
    with contextlib.suppress(OSError, IndexError):  # Linux: the state follows the command name in parentheses
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return False
    return True


@dataclass
class Holder:
    """Who holds (or wants) the lock; `token` tells this holder's lock from a later one with the same pid."""

    host: str
    pid: int
    slurm_job_id: str | None
    slurm_restart_count: int
    started: str
    heartbeat: str
    token: str
    written: float | None = field(default=None, compare=False)  # the lock file's mtime, on this host's clock

    @classmethod
    def here(cls) -> Holder:
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        now = _now()
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            slurm_job_id=os.environ.get("SLURM_JOB_ID") or None,
            slurm_restart_count=int(restarts) if restarts.isdigit() else 0,
            started=now,
            heartbeat=now,
            token=secrets.token_hex(8),
        )

    @classmethod
    def parse(cls, data: bytes, where: Path) -> Holder:
        """The holder in a lock file, refused by name when it is not one this trainer wrote."""
        try:
            obj = json.loads(data)
            holder = cls(**obj)
            for stamp in (holder.started, holder.heartbeat):  # both readable times
                datetime.fromisoformat(stamp)
            if not isinstance(holder.pid, int) or not isinstance(holder.slurm_restart_count, int):
                raise TypeError("pid and slurm_restart_count must be integers")
            if isinstance(holder.pid, bool) or holder.pid < 1:  # 0 and -N name process groups to os.kill
                raise ValueError(f"pid {holder.pid} is no process's")
        except (ValueError, TypeError) as e:
            raise DataError(
                f"{where}: not a save-folder lock this trainer wrote ({e}; got "
                f"{shown(data.decode(errors='replace'))}); if no run is writing to this save folder, delete the file "
                "and start again"
            ) from e
        return holder

    def silent_s(self) -> float:
        """Seconds since the holder's last heartbeat. A heartbeat in the future (the holder's clock runs ahead)
        says nothing: the age of the file itself, which every heartbeat rewrites, is taken instead, on this
        host's clock, so a dead holder with a fast clock is taken over after the timeout like any other."""
        age = _age_s(self.heartbeat)
        if age < 0 and self.written is not None:
            age = time.time() - self.written
        return max(0.0, age)

    def describe(self) -> str:
        """host, pid, Slurm job, since when, last heartbeat: enough to find the holder and judge whether it lives."""
        job = f", Slurm job {self.slurm_job_id} (restart {self.slurm_restart_count})" if self.slurm_job_id else ""
        ahead = _age_s(self.heartbeat) < 0
        future = f" (its stamp {self.heartbeat} is in the future: the file's time is used)" if ahead else ""
        return (
            f"host {self.host}, pid {self.pid}{job}, since {self.started}, "
            f"last heartbeat {self.silent_s():.0f}s ago{future}"
        )

    def gone_because(self, me: Holder, timeout_s: float) -> str | None:
        """Why this holder surely no longer writes (so `me` may take the lock over), or None if it may."""
        if self.host == me.host and not _pid_alive(self.pid):
            return "no such process on this host"
        if self.slurm_job_id and self.slurm_job_id == me.slurm_job_id:
            if me.slurm_restart_count > self.slurm_restart_count:
                return f"Slurm requeued the job (restart {me.slurm_restart_count})"
        age = self.silent_s()
        if age > timeout_s:
            return f"no heartbeat for {age:.0f}s, more than {TIMEOUT_KEY} ({timeout_s:g}s)"
        return None

    def to_bytes(self) -> bytes:
        return json_bytes({k: v for k, v in asdict(self).items() if k != "written"})


class SaveFolderLock:
    """The lock of one save folder, held by rank 0 (`enabled` elsewhere False: every call is then a no-op).

    `acquire` takes it or raises a DataError naming the holder; `release` (idempotent, also after an error)
    stops the heartbeat and removes the file if it is still this run's."""

    def __init__(self, folder: Path, timeout_s: float, enabled: bool = True) -> None:
        self.path = folder / WRITER_LOCK
        self.timeout_s = timeout_s
        self.enabled = enabled
        self.holder: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # who took the lock over while this run held it (it was silent past the timeout, e.g. suspended); the loop
        # then stops without writing more: two writers would overwrite each other's checkpoints and metrics
        self.lost_to: str | None = None

    def acquire(self) -> None:
        """Take the lock, taking over a dead holder's; the save folder must exist. Every failure is a DataError,
        so that `raise_together` stops all ranks with it (another exception would leave them waiting)."""
        if not self.enabled or self.holder is not None:
            return
        try:
            self._acquire()
        except OSError as e:
            raise DataError(f"{self.path}: cannot take the save folder's lock ({e}); is save_folder writable?") from e

    def _acquire(self) -> None:
        me = Holder.here()
        deadline = time.monotonic() + 60
        while not self._create(me):
            current = self._read()
            if current is None:  # removed since: its run ended
                continue
            reason = current.gone_because(me, self.timeout_s)
            if reason is None:
                raise DataError(
                    f"{self.path.parent}: another run is writing to this save folder ({current.describe()}; "
                    f"{self.path}). Wait for it to end or stop it, or use another save_folder; if that run is dead, "
                    f"delete {self.path} (a holder on another host is taken over once its heartbeat is older than "
                    f"{TIMEOUT_KEY}, {self.timeout_s:g}s)"
                )
            if self._take_over(current, me):
                log.warning(
                    "took over the save folder lock %s from a run that is gone (%s): %s",
                    self.path,
                    reason,
                    current.describe(),
                )
                break
            if time.monotonic() > deadline:
                raise DataError(f"{self.path}: other launches keep taking this lock over; start one run at a time")
        self.holder = me
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="save-folder-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self.holder is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = self._read_quietly()
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        self.holder = None

    def _create(self, me: Holder) -> bool:
        """Create the lock file holding `me`, unless it exists (atomically: O_EXCL)."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(me.to_bytes())
                f.flush()
                os.fsync(f.fileno())
        except BaseException:  # e.g. a full disk: no empty lock left to refuse the next launch
            self.path.unlink(missing_ok=True)
            raise
        return True

    def _read(self) -> Holder | None:
        """The current holder (None: no lock file). A file just created by a racing launch may still be empty:
        read again for a moment before calling it damaged."""
        for attempt in range(10):
            try:
                data = self.path.read_bytes()
                written = self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            try:
                return replace(Holder.parse(data, self.path), written=written)
            except DataError:
                if attempt == 9:
                    raise
                time.sleep(0.1)
        return None

    def _read_quietly(self) -> Holder | None:
        with contextlib.suppress(OSError, DataError):
            return Holder.parse(self.path.read_bytes(), self.path)
        return None

    def _take_over(self, stale: Holder, me: Holder) -> bool:
        """Replace the lock of `stale` with one holding `me`, if it still is `stale`'s. Launches taking a lock over
        take turns through a guard file (O_EXCL too): the lock is replaced in one rename, never absent, so a launch
        creating it afresh cannot slip in, and of two taking it over the second finds the first's lock, alive."""
        guard = self.path.with_name(f"{WRITER_LOCK}{TAKEOVER_SUFFIX}")
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - guard.stat().st_mtime > 30:  # left by a launch killed in the middle of a takeover
                    guard.unlink()
            time.sleep(0.05)
            return False
        try:
            current = self._read()
            if current is None or current.token != stale.token:
                return False
            with atomic_path(self.path) as tmp:
                tmp.write_bytes(me.to_bytes())
            return True
        finally:
            guard.unlink(missing_ok=True)

    def _beat(self) -> None:
        """Refresh the heartbeat until released. If another launch took the lock over (this run was silent past
        the timeout, e.g. suspended), say so once, record it in `lost_to` (the loop stops at its next step, before
        writing anything more) and stop refreshing: the file is no longer this run's."""
        assert self.holder is not None
        warned = False
        while not self._stop.wait(heartbeat_interval(self.timeout_s)):
            current = self._read_quietly()
            if current is not None and current.token != self.holder.token:
                self.lost_to = current.describe()
                log.error(
                    "the save folder lock %s was taken over by another run (%s): this run stops at its next step "
                    "without writing to the save folder again",
                    self.path,
                    self.lost_to,
                )
                return
            self.holder.heartbeat = _now()
            try:
                with atomic_path(self.path) as tmp:
                    tmp.write_bytes(self.holder.to_bytes())
                warned = False
            except OSError as e:
                if not warned:
                    log.warning("could not refresh the heartbeat of %s: %s", self.path, e)
                    warned = True
