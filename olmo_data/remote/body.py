"""Reading an HTTP response body within a memory bound, whatever the server does (`olmo_data.remote` uses these).

Why: a server that ignores `Range` (Python's own `http.server`, many static file servers) answers every ranged
request with 200 and the whole file. Reading that body to the end of the range wanted would hold the file up to
there in memory (a range near the end of a 10 GB file: 10 GB); downloading a file in concurrent ranged chunks
from it would transfer the file once per chunk. And a side file (a manifest, `checksums.json`) read whole is
only small if the server is honest: one announcing 10^12 bytes, or sending without end, must be refused, not
read. So a whole-file body is read piece by piece: the bytes before a range are dropped as they arrive, a
download from such a server is streamed once, and a whole-file read stops at a cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PIECE = 1 << 20  # bytes read from a response at a time


class BodyTooLarge(Exception):
    """A body announced as, or found, larger than its cap."""

    def __init__(self, size: int | None, cap: int) -> None:
        said = f"announces {size:,} bytes" if size is not None else "sends more"
        super().__init__(f"the server {said}, more than the {cap:,} allowed for this file")
        self.size = size
        self.cap = cap


def announced(headers: Any) -> int | None:
    """The body's length as the response announces it (None: not said, or not a number)."""
    value = headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def check_cap(size: int | None, cap: int | None) -> None:
    """Refuse a body announced longer than `cap` before a byte of it is read."""
    if cap is not None and size is not None and size > cap:
        raise BodyTooLarge(size, cap)


def read_capped(response: Any, cap: int) -> bytes:
    """The whole body, refused (BodyTooLarge) once it grows past `cap`: memory holds at most `cap` + one piece."""
    check_cap(announced(response.headers), cap)
    parts: list[bytes] = []
    held = 0
    while piece := response.read(PIECE):
        held += len(piece)
        if held > cap:
            raise BodyTooLarge(None, cap)
        parts.append(piece)
    return b"".join(parts)


def read_slice(response: Any, start: int, length: int) -> bytes:
    """Bytes `start`..`start + length` of a whole-file body; those before `start` are dropped as they arrive, so
    memory holds the slice and one piece, never the file up to there. Fewer bytes: the file ends first."""
    skip = start
    while skip > 0:
        piece = response.read(min(PIECE, skip))
        if not piece:
            return b""
        skip -= len(piece)
    parts: list[bytes] = []
    wanted = length
    while wanted > 0 and (piece := response.read(min(PIECE, wanted))):
        parts.append(piece)
        wanted -= len(piece)
    return b"".join(parts)


class Stream:
    """A download from a server that ignores `Range`, streamed once to `write` a piece at a time. An attempt that
    fails mid-body is retried by the caller from byte 0 (the server offers nothing else); the bytes `write`
    already had are then read past, not given again, so `write` may be a hash that cannot go back."""

    def __init__(self, write: Callable[[bytes], Any], total: int) -> None:
        self.write = write
        self.total = total
        self.done = 0  # bytes given to `write` so far, over all attempts

    def __call__(self, response: Any) -> bytes:
        """Consume one whole-file response (the attempt's `consume`); a body of another length than the file's
        size is `ValueError` (the file changed, or the server lies: the caller retries, then gives up)."""
        size = announced(response.headers)
        if size is not None and size != self.total:
            raise ValueError(f"the file now announces {size} bytes, not {self.total}")
        seen = 0
        while seen < self.total:
            piece = response.read(min(PIECE, self.total - seen))
            if not piece:
                raise ValueError(f"short body ({seen} of {self.total} bytes)")
            fresh = piece[max(0, self.done - seen) :]
            seen += len(piece)
            if fresh:
                self.write(fresh)
                self.done += len(fresh)
        return b""
