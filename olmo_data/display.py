"""What a person sees on a terminal, one way in every command: progress bars, and marked spans of text.

Progress bars: on stderr, on a terminal only, from the first process only. Every command that can run longer
than a few seconds shows one (tqdm: a total and an ETA where the work's size is known up front). A bar is drawn
when `progress` is True; when it is None (the default), when stderr is a terminal, or when the environment sets
`OLMO_PROGRESS=1` (tests and logs that want the bars); `OLMO_PROGRESS=0` turns them off. Under torchrun only
rank 0 draws, so N processes do not draw N bars over each other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["ENV", "MARK_CLOSE", "MARK_OPEN", "Stages", "bar_disabled", "marked", "progress_bar"]

ENV = "OLMO_PROGRESS"
# Spans of a text (found in the training data by `trace --spans` and `generate --trace`; not trained in
# `inspect-batch --decode`) between these: plain characters, so a pipe, a log file and a copy keep them.
MARK_OPEN, MARK_CLOSE = "[[", "]]"
T = TypeVar("T")


def bar_disabled(progress: bool | None) -> bool | None:
    """tqdm's `disable` for a command's `progress` choice: True off, False on, None "on a terminal only"."""
    if os.environ.get("RANK", "0") != "0":
        return True
    if progress is not None:
        return not progress
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return False
    if forced in ("0", "false", "no", "off"):
        return True
    return None


def progress_bar(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    total: float | None = None,
    unit: str = "it",
    progress: bool | None = None,
    **options: Any,
) -> Any:
    """A tqdm bar (over `iterable`, or updated by hand) with this project's rules for when it shows; `unit` gets
    SI prefixes (`unit_scale`) for byte and token counts; `delay=S` draws it only once the work has taken S
    seconds (work that is usually quick stays silent), except where bars are asked for explicitly. Returns
    tqdm's object: use it as a context manager."""
    disable = bar_disabled(progress)
    if disable is None and "file" not in options and not _stderr_is_terminal():
        disable = True
    if disable is True:  # tqdm's import (and its monitor thread) cost a fresh command tens of ms for nothing
        return Silent(iterable, total)
    from tqdm import tqdm

    if disable is False:
        options.pop("delay", None)
    scaled = unit.strip() in ("B", "tokens", "bytes")
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        unit_scale=scaled,
        unit_divisor=1024 if unit.strip() == "B" else 1000,
        disable=disable,
        dynamic_ncols=True,
        **options,
    )


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed: no terminal
        return False


class Silent:
    """A progress bar that draws nothing, as tqdm's disabled one does: iterates its iterable, and takes every
    call (update, set_postfix, close, ...) as a no-op."""

    def __init__(self, iterable: Iterable[Any] | None, total: float | None) -> None:
        self.iterable, self.total, self.n, self.disable = iterable, total, 0, True

    def __iter__(self) -> Any:
        return iter(self.iterable if self.iterable is not None else ())

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def marked(segments: Iterable[tuple[str, bool]]) -> str:
    """The text of (piece, is_marked) segments, with the marked pieces between [[ and ]]."""
    return "".join(f"{MARK_OPEN}{piece}{MARK_CLOSE}" if inside else piece for piece, inside in segments)


class Stages:
    """A bar over a few named stages of unequal length (load a model, build the tasks, write the files): which
    one is running and how long it has taken. `start(name)` begins a stage (the ones before it count as done)."""

    def __init__(self, desc: str, names: Iterable[str], *, progress: bool | None = None, delay: float = 0.0):
        self.names = list(names)
        fmt = "{desc}: {n_fmt}/{total_fmt}{postfix} [{elapsed}]"  # tqdm writes the postfix as ", NAME"
        self.bar = progress_bar(
            desc=desc, total=len(self.names), unit=" stages", progress=progress, delay=delay, bar_format=fmt
        )

    def start(self, name: str) -> None:
        self.bar.update(self.names.index(name) - self.bar.n)
        self.bar.set_postfix_str(name)

    def close(self, finished: bool = True) -> None:
        if finished:
            self.bar.update(len(self.names) - self.bar.n)
        self.bar.close()

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(finished=kind is None)
