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
import sys
import warnings
from collections.abc import Iterator

__all__ = ["quietly"]

CHATTY_LOGGERS = ("torchao", "torch.utils._pytree")  # (transformers sets its own logger's level when imported)


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
