"""Stopping a long command cleanly on SIGTERM or Ctrl-C, and ending its worker processes without tracebacks.

A scheduler stops a job with SIGTERM (Slurm's scancel or time limit, Kubernetes), a user with Ctrl-C (SIGINT, sent
to every process of the terminal's foreground group). Python's default for SIGTERM ends the process at once: no
`finally` or `except` runs, so `.tmp-` files stay until a rerun, and workers left without their parent print
BrokenPipeError tracebacks. Within `stop_on_signals` both signals raise `Interrupted` (a KeyboardInterrupt) in the
main thread instead, so the cleanup that runs for any failure runs for these too, and the command exits with the
conventional status 128 + the signal's number (143, 130).

Worker processes call `quiet_worker` first: the parent alone decides, and ends its pool itself, waiting for the
workers to stop (`ProcessPoolExecutor.shutdown(cancel_futures=True)`) rather than killing them: a worker killed while
it writes a result holds the result queue's lock for ever, and `multiprocessing.Pool.terminate` can then hang
(CPython issue 96995).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the command stops, removing what it had half written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The status a shell reports for a process this signal ended: 128 + its number."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise `Interrupted` in the main thread (elsewhere: no change).

    A second signal, while the first one's cleanup runs, ends the process at once with the same status: someone
    who asks twice wants it gone now, and the cleanup it cuts short is the same a rerun does.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if _held and not stopping:  # inside `signals_deferred`: raised when its block ends
            _pending.append(signum)
            return
        if stopping:
            sys.stderr.write(f"\n{signal.Signals(signum).name} again: stopping at once\n")
            os._exit(128 + signum)
        stopping = True
        raise Interrupted(signum)

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_held = 0  # depth of `signals_deferred` blocks in the main thread
_pending: list[int] = []  # a signal that arrived within one


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within the block, a signal `stop_on_signals` would raise is held, and raised as `Interrupted` when the block
    ends. For a few statements that must run together: creating a temporary file and recording it for cleanup (a
    signal in between would leave a file no one knows of). Blocking the signal at the OS level is not enough: one
    delivered just before the block runs its Python handler at whatever statement comes next."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
    if not _held and _pending:
        raise Interrupted(_pending.pop())


def quiet_worker() -> None:
    """In a worker process, first thing: Ctrl-C is for the parent (which ends its workers itself), and SIGTERM ends
    the worker at once, as it would had a forked worker not inherited the parent's handler."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
