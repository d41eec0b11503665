"""Writes the file system refuses (a full disk, a quota, a read-only mount, no permission) as one line.

A run that fills its disk used to die with sixty lines of traceback ending in torch's `enforce fail at
inline_container.cc ... unexpected pos 704 vs 598` (torch's serializer wraps the OSError), naming neither the disk
nor the folder, and the half-written `.tmp-stepN` it left kept the disk full, so the rerun failed the same way.
Here a refused write becomes a `DataError` naming the folder, what was being written and, for a checkpoint, the
space the last one took against what is free once the partial one is gone: the user's to fix, after which the
same command resumes from the last complete checkpoint.

Under several ranks every rank writes part of a checkpoint, and one may be refused while the others are not: a
save ends each of its phases in `together`, a collective where every rank learns of any rank's refusal, so all
remove the partial checkpoint and exit with the same line instead of waiting in the next collective.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from olmo_data.errors import DataError
from olmo_train.checkpoint.layout import latest_checkpoint, list_checkpoints
from olmo_train.distributed import Dist, all_gather_objects, barrier, broadcast_object

log = logging.getLogger(__name__)

T = TypeVar("T")

# what each refusal means, and what the user can do about it
REFUSALS = {
    errno.ENOSPC: ("the disk is full", "free space there"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space within the quota (or raise it)"),
    errno.EROFS: ("the file system is read-only", "mount it writable or choose another save_folder"),
    errno.EACCES: ("permission denied", "make it writable or choose another save_folder"),
}
# torch's zip writer reports a failed write in these words and may keep no OSError in the exception's chain
# (writing to a path from C++); then a disk with less than LOW_FREE left is taken to be the cause
_SERIALIZER_SIGNS = ("enforce fail", "unexpected pos", "file write failed", "iostream error")
LOW_FREE = 64 << 20


def free_bytes(folder: Path) -> int | None:
    """Space a write in `folder` (or its nearest existing parent) may still take; None if it cannot be told."""
    for p in (folder, *folder.parents):
        if p.exists():
            with contextlib.suppress(OSError):
                return shutil.disk_usage(p).free
            return None
    return None


def size_of(path: Path) -> int:
    """The bytes of every file under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def human(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def refusal(e: BaseException, folder: Path) -> int | None:
    """The errno of `e` if it is, or was caused by, a write the file system refused (REFUSALS); else None.

    Looks through the causes and contexts (torch.save re-raises an OSError as a RuntimeError) and through each
    rank's failure that DCP gathers into its CheckpointException (a BaseException, not an Exception); when only
    torch's serializer words are left, a nearly full disk is taken as the cause."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    serializer = False
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in REFUSALS:
            return x.errno
        serializer = serializer or any(sign in str(x) for sign in _SERIALIZER_SIGNS)
        stack += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)  # DCP: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            stack += [f[0] for f in failures.values() if isinstance(f, tuple) and f]
    if serializer and (free := free_bytes(folder)) is not None and free < LOW_FREE:
        return errno.ENOSPC
    return None


def last_checkpoint(folder: Path, unsharded: bool | None = None) -> Path | None:
    """The newest complete checkpoint in `folder` of the kind asked (a save needs about as much room as the last
    one of its kind took), else the one a resume would take."""
    same = [path for _, kind, path in list_checkpoints(folder) if kind == unsharded]
    return same[-1] if same else latest_checkpoint(folder)


def refused_message(folder: Path, what: str, code: int, removed: bool, unsharded: bool | None = None) -> str:
    """One line: where, what, why, the space at stake, and what to do (`removed`: a partial checkpoint was; of
    the kind `unsharded`)."""
    meaning, remedy = REFUSALS[code]
    free = free_bytes(folder)
    last, resumed = last_checkpoint(folder, unsharded), latest_checkpoint(folder)
    line = f"{folder}: {meaning} ({os.strerror(code)}) while writing {what}"
    if removed:
        line += "; the partial checkpoint was removed"
    if code in (errno.ENOSPC, errno.EDQUOT):
        took = f"the last checkpoint ({last.name}) takes {human(size_of(last))}, " if last is not None else ""
        line += f"; {took}{human(free)} is free now"
        remedy += " (or lower save_num_checkpoints_to_keep)" if last is not None else ""
    resume = f"resumes from {resumed.name}" if resumed is not None else "starts afresh"
    return f"{line}: {remedy} and rerun the same command (it {resume})"


@contextlib.contextmanager
def refused_writes(folder: Path, what: str) -> Iterator[None]:
    """Writes of one rank outside a checkpoint (metrics.jsonl, the run's config.yaml): a refusal becomes the one
    line of `refused_message`. Atomic writes remove their own temporary file."""
    try:
        yield
    except DataError:
        raise
    except BaseException as e:
        code = refusal(e, folder)
        if code is None:
            raise
        raise DataError(refused_message(folder, what, code, removed=False)) from e


class SaveGuard:
    """One checkpoint save on every rank: `together` runs a phase's writes on each rank and ends the phase in a
    collective; `what` names what is being written now, for the message."""

    def __init__(self, folder: Path, name: str, tmp: Path, d: Dist, unsharded: bool) -> None:
        self.folder, self.name, self.tmp, self.d, self.unsharded = folder, name, tmp, d, unsharded
        self.what = "the checkpoint"

    def together(self, write: Callable[[], T]) -> T:
        """Run `write` on this rank, then learn whether any rank's write failed. A refusal (a full disk...) on any
        rank: every rank removes the partial checkpoint and raises the same DataError (rank 0's message, with the
        free space measured once the partial files are gone). Any other failure: the partial checkpoint is
        removed too, the rank that met it raises its own error and the others say which rank failed, so no rank
        is left waiting for a collective that will never come."""
        problem: dict[str, Any] | None = None
        result: T | None = None
        failure: BaseException | None = None
        try:
            result = write()
        except BaseException as e:
            if not isinstance(e, Exception) and getattr(e, "failures", None) is None:
                raise  # KeyboardInterrupt, SystemExit; DCP's CheckpointException (a BaseException) is handled
            code = None if isinstance(e, DataError) else refusal(e, self.folder)
            failure = e
            problem = {"rank": self.d.rank, "code": code, "what": self.what, "partial": self.tmp.exists()}
            problem["bad_input"] = isinstance(e, DataError)
            problem["error"] = str(e) if isinstance(e, DataError) else f"{type(e).__name__}: {str(e)[:300]}"
        problems = [cast("dict[str, Any]", p) for p in all_gather_objects(problem) if p]
        if not problems:
            return result  # type: ignore[return-value]
        shutil.rmtree(self.tmp, ignore_errors=True)  # every rank: its own files, wherever they are
        barrier()
        refused = next((p for p in problems if p["code"] is not None), None)
        if refused is None:
            first = problems[0]
            if first["bad_input"]:  # as raise_together: the first rank's DataError on all of them
                raise DataError(first["error"]) from failure
            if failure is not None:
                raise failure
            raise RuntimeError(f"{self.name}: rank {first['rank']} failed writing {first['what']}: {first['error']}")
        message = None
        if self.d.is_main:
            shutil.rmtree(self.tmp, ignore_errors=True)  # what a rank wrote after another removed the directory
            what = f"{refused['what']} of {self.name}"
            message = refused_message(self.folder, what, refused["code"], refused["partial"], self.unsharded)
        raise DataError(str(broadcast_object(message))) from failure


def warn_if_short(folder: Path, unsharded: bool) -> None:
    """Before a save: say so if the folder has less space free than the last checkpoint (of the same kind)
    took, so the user can act before the save fails (it is still attempted: it may fit)."""
    last = last_checkpoint(folder, unsharded)
    free = free_bytes(folder)
    if last is None or free is None:
        return
    took = size_of(last)
    if free < took:
        log.warning(
            "%s: %s free, less than the last checkpoint (%s) took (%s): this save may fail for want of space; "
            "free space there or lower save_num_checkpoints_to_keep",
            folder,
            human(free),
            last.name,
            human(took),
        )
