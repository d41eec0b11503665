"""How worker processes are started: forked where that is safe, spawned where it is not.

Forking is the fast way (workers start at once, inherit the imported modules and share the page cache of memory
maps), and `olmo-data` commands run in processes that hold no threads when they fork. But a process that has loaded
torch has started an OpenMP runtime (its intra-op thread pool); a forked child inherits that runtime's state without
its threads, and its own first parallel region (pydivsufsort and tokenizers use OpenMP or thread pools too) can hang
or crash, as can the parent's next one. That process is a notebook, `olmo-train generate --trace`, or a test suite
calling the commands in-process: there the workers are spawned instead.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing.context import BaseContext

THREADED_RUNTIMES = ("torch",)  # modules whose import starts a thread pool that a fork must not copy


def pool_context() -> BaseContext:
    """The multiprocessing context for a pool of workers: fork when the platform has it and no threaded runtime is
    loaded in this process, else spawn."""
    if "fork" in mp.get_all_start_methods() and not any(m in sys.modules for m in THREADED_RUNTIMES):
        return mp.get_context("fork")
    return mp.get_context("spawn")
