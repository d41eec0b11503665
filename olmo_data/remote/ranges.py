"""Ranges of remote files, and the HTTP headers about them: merging neighbouring ranges into few requests, reading
`Content-Range` and `Retry-After`. Pure functions, kept apart from the reader (`olmo_data.remote`) that uses them.
"""

from __future__ import annotations

from collections.abc import Sequence

Range = tuple[str, int, int]  # (url, first byte, number of bytes)


def coalesce(ranges: Sequence[Range], gap: int, max_bytes: int) -> list[tuple[Range, list[int]]]:
    """Merge ranges of the same file that overlap or lie within `gap` bytes of each other into requests of at
    most `max_bytes` (a single longer range stays whole). Returns each request and the positions in `ranges`
    of the ranges it serves."""
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1]))
    out: list[tuple[Range, list[int]]] = []
    url, lo, hi, members = "", 0, 0, list[int]()  # the request being grown: bytes [lo, hi)
    for i in order:
        u, s, n = ranges[i]
        if members and u == url and s <= hi + gap and max(hi, s + n) - lo <= max_bytes:
            hi = max(hi, s + n)
            members.append(i)
            continue
        if members:
            out.append(((url, lo, hi - lo), members))
        url, lo, hi, members = u, s, s + n, [i]
    if members:
        out.append(((url, lo, hi - lo), members))
    return out


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header given in seconds (an HTTP date is taken as "soon": 1 s)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return 1.0


def content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """(first, last, total or None) from a Content-Range header `bytes a-b/n`; None when absent or unreadable."""
    if not value or not value.startswith("bytes "):
        return None
    try:
        span, _, total = value[6:].partition("/")
        a, _, b = span.partition("-")
        return int(a), int(b), (None if total in ("", "*") else int(total))
    except ValueError:
        return None
