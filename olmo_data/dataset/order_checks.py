"""Verdicts on order files kept between commands: an order file checked whole once is not checked again.

Why: reading a whole epoch's order (trace's search) checks it to be a permutation of the data's instances, ~13 s
at OLMo 3's scale (730M entries); a repeated trace would pay it every time for a file that has not changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from olmo_data.io import default_cache_dir


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
