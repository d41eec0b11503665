"""Searching an order file a block at a time, and verdicts on order files kept between commands.

Why: trace looks for a document's instances in each epoch's whole order, 2.9 GB at OLMo 3's scale (730M
entries): read a block at a time it is never resident whole. The same pass checks the file (a permutation of
the data's instances, ~13 s at that scale), and the verdict is kept, so a repeated trace of a file that has not
changed only searches.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable

import numpy as np

from olmo_data.io import default_cache_dir

SCAN_ENTRIES = 1 << 25  # entries of an order file read at a time by `search_order_file` (128 MB of uint32)


def verified_marker(path: str, what: str = "") -> str | None:
    """Where the verdict that (part `what` of) a local order file was checked whole is kept: its path, size and
    mtime hashed, so a file rewritten since gets another name (`$OLMO_DATA_CACHE/order-checks/`, empty files:
    any may be deleted); None when the file cannot be stat'ed. A whole order at OLMo 3's scale takes ~13 s to
    check, so a repeated trace checks it once."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}\n{st.st_size}\n{st.st_mtime_ns}\n{what}".encode()
    return os.path.join(default_cache_dir(), "order-checks", hashlib.sha256(key).hexdigest()[:32])


def remember_verified(marker: str | None) -> None:
    """Keep a `verified_marker` verdict (a cache write that fails only costs checking again)."""
    if marker is not None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()


def already_verified(marker: str | None) -> bool:
    """Whether a `verified_marker` verdict is kept (None: the file could not be stat'ed, so it is not)."""
    return marker is not None and os.path.exists(marker)


def search_order_file(
    path: str,
    dtype: np.dtype,
    start: int,
    stop: int,
    wanted: np.ndarray,
    check: Callable[[np.ndarray, int], None] | None = None,
    offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, entries as int64) of entries start..stop of the order file `path` (headerless, `dtype`, from
    byte `offset`) holding one of the instances `wanted`, read SCAN_ENTRIES at a time, never mapped whole;
    `check(block, first position)` sees every block before it is searched."""
    dtype = np.dtype(dtype)
    found, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    with open(path, "rb") as f:
        f.seek(offset + start * dtype.itemsize)
        for lo in range(start, stop, SCAN_ENTRIES):
            block = np.fromfile(f, dtype=dtype, count=min(SCAN_ENTRIES, stop - lo))
            if check is not None:
                check(block, lo)
            at = np.flatnonzero(np.isin(block, wanted))
            found.append(at + lo)
            values.append(block[at].astype(np.int64))
    return np.concatenate(found), np.concatenate(values)
