"""A remote file's stat and its first bytes from one request: a ranged GET of bytes 0..n-1.

Why: opening a remote document index needs its size and ETag (the key of its cached head, and what every later
ranged read of it is checked against) and then its head, its first few KB. Asked as a HEAD and then a GET, the
3,000 index files of OLMo 3's data cost 6,000 requests; a ranged GET's answer carries both (`Content-Range: bytes
0-N/SIZE`, `ETag`, `Last-Modified`), so one request each does. What it says of the file is kept exactly where a
HEAD's answer would be (`sizes`: this process's memo and the disk cache, a 404 believed for `ABSENT_TTL_S`), so
later reads are checked against it and a later command asks nothing. Files the cache knows are not asked.
"""

from __future__ import annotations

import os
from functools import partial

from olmo_data.remote.body import read_slice
from olmo_data.remote.ranges import content_range
from olmo_data.remote.reader import HTTPStatusError, Permanent, RemoteReader, Transient
from olmo_data.remote.sizes import RemoteStat, ask, keep, known_stats, text


def start_once(reader: RemoteReader, url: str, length: int) -> tuple[int, str | None, str | None, bytes]:
    """One attempt at (size, ETag, Last-Modified, the first `length` bytes: all of a smaller file)."""
    if length <= 0 or not url.startswith(("http://", "https://", "s3://")):
        size, etag, modified = reader.stat_once(url)  # (other schemes: a size and a read)
        return size, etag, modified, reader._fetch(url, 0, min(length, size)) if min(length, size) > 0 else b""
    if url.startswith("s3://"):
        return _s3_start(reader, url, length)
    try:
        ranged = {"Range": f"bytes=0-{length - 1}"}  # (a 200's body: its first bytes kept, the rest not read)
        status, headers, body = reader._http_request("GET", url, ranged, partial(read_slice, start=0, length=length))
    except Permanent as e:
        if isinstance(e.__cause__, HTTPStatusError) and e.__cause__.code == 416:  # an empty file: no bytes to range
            return (*reader.stat_once(url), b"")
        raise
    if status == 200:  # a server that ignores Range: its whole file, whose length it announced
        if headers.get("Content-Length") is None:
            raise Permanent("the server does not say the file's size (no Content-Length)")
        return int(headers["Content-Length"]), headers.get("ETag"), headers.get("Last-Modified"), body
    if status != 206:
        raise Transient(f"HTTP {status} to a ranged GET")
    total = _checked(headers.get("Content-Range"), length, body)
    if total is None:  # `bytes 0-N/*`: a server that does not know the size in a range's answer; a HEAD says it
        return (*reader.stat_once(url), body)
    return total, headers.get("ETag"), headers.get("Last-Modified"), body


def _s3_start(reader: RemoteReader, url: str, length: int) -> tuple[int, str | None, str | None, bytes]:
    bucket, key = url[5:].split("/", 1)
    client = reader._s3_client()
    try:
        obj = reader._s3_call(lambda: client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{length - 1}"))
    except Permanent as e:
        if "InvalidRange" in str(e):  # an empty object
            return (*reader.stat_once(url), b"")
        raise
    body = reader._s3_call(lambda: reader._s3_body(obj))
    size = _checked(obj.get("ContentRange"), length, body)
    if size is None:
        return (*reader.stat_once(url), body)
    return size, obj.get("ETag"), text(obj.get("LastModified")), body


def _checked(header: str | None, length: int, body: bytes) -> int | None:
    """The file's size from a 206's Content-Range, which must say bytes 0..min(length, size) - 1, the body's; None
    where it gives the range but not the size (`/*`, which RFC 9110 allows: the caller asks a HEAD)."""
    got = content_range(header)
    if got is None:
        raise Transient(f"206 without a readable Content-Range ({header!r})")
    start, end, size = got
    if (start, end) != (0, min(length, size if size is not None else length) - 1) or len(body) != end + 1:
        raise Transient(f"wrong range (bytes {start}-{end} of {size}, a body of {len(body)} bytes)")
    return size


def stat_and_start_many(
    reader: RemoteReader,
    urls: list[str],
    length: int,
    root: str | os.PathLike[str] | None,
    *,
    progress: bool | None = None,
) -> tuple[dict[str, RemoteStat], dict[str, bytes]]:
    """The stat of each URL (as `sizes.stat_many` with `missing_ok`: a missing file's size is None, and cached),
    and the first `length` bytes of those that had to be asked, from the same requests."""
    out, todo, cache = known_stats(urls, root)
    if not todo:
        return out, {}
    fresh = ask(reader, todo, progress, partial(start_once, reader, length=length))
    keep({u: stat for u, (stat, _) in fresh.items()}, cache, missing_ok=True)
    out.update({u: stat for u, (stat, _) in fresh.items()})
    return out, {u: data for u, (stat, data) in fresh.items() if data is not None and stat.size is not None}
