"""One driver for scans of a run's token files: `trace --tokens` (where a sequence occurs) and `trace --spans`
without an index (where the k-grams of a text occur) read every token once, in chunks of `SCAN_CHUNK` tokens, each
chunk a task for a worker that memory-maps its file; the driver spreads the tasks, shows one progress bar, and
hands each chunk's answer back with its file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from olmo_data.dataset import InstanceSource
from olmo_data.display import progress_bar
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.processes import pool_context

PROGRESS_DELAY = 2.0  # seconds before a search shows its bar (most searches take less)
SCAN_CHUNK = 1 << 24  # tokens per scan task: large enough for numpy to run at memory speed, small enough to share


def pooled(processes: int, total_tokens: int) -> bool:
    """Whether a scan of `total_tokens` runs in a pool of `processes`: not for small data (starting processes
    costs more than it saves below a few chunks)."""
    return processes > 1 and total_tokens >= 4 * SCAN_CHUNK


def scan_tasks(fn: Callable[[Any], Any], tasks: list[Any], processes: int, total_tokens: int) -> Iterator[Any]:
    """`fn` over the chunks of a scan, in completion order: here for small data, else (`pooled`) in a pool of
    `processes` (forked where the platform can, so the workers share the memory maps' page cache)."""
    if not pooled(processes, total_tokens):
        yield from map(fn, tasks)
        return

    ctx = pool_context()
    with ctx.Pool(min(processes, len(tasks))) as pool:
        yield from pool.imap_unordered(fn, tasks)


def scanned_files(source: InstanceSource) -> dict[str, tuple[str, int]]:
    """{path: (dtype, tokens)} of the distinct token files a scan reads; remote files are refused (a scan reads
    every byte: copy them here, or build an index)."""
    files: dict[str, tuple[str, int]] = {}
    for f in source.files:
        if is_remote(f.path):
            raise DataError(f"{f.path}: searching token sequences reads whole files; copy the token files here first")
        files.setdefault(f.path, (f.dtype, f.num_tokens))
    return files


def scanned_tokens(files: dict[str, tuple[str, int]]) -> int:
    """The tokens a scan of `scanned_files` reads."""
    return sum(n for _, n in files.values())


def scan(
    source: InstanceSource,
    fn: Callable[[Any], tuple[str, int, Any]],
    args: tuple[Any, ...],
    *,
    processes: int = 1,
    progress: bool | None = None,
) -> Iterator[tuple[str, Any]]:
    """(path, answer) for every chunk of every token file, in completion order: `fn((path, dtype, lo, hi, *args))`
    answers for tokens [lo, hi) of one file and returns (path, hi - lo, answer)."""
    files = scanned_files(source)
    tasks = [
        (path, dtype, lo, min(lo + SCAN_CHUNK, n), *args)
        for path, (dtype, n) in files.items()
        for lo in range(0, n, SCAN_CHUNK)
    ]
    total = scanned_tokens(files)
    with progress_bar(desc="search", total=total, unit=" tokens", progress=progress, delay=PROGRESS_DELAY) as bar:
        for path, n, answer in scan_tasks(fn, tasks, processes, total):
            yield path, answer
            bar.update(n)
