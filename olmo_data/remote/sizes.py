"""Sizes of remote files, asked once: concurrently, at most once per process, and kept on disk.

Why: a run names thousands of remote token files, and everything about it (instances, the order's length, which
file a step reads) starts from their sizes. Asked one HEAD at a time, 4,000 files at 50 ms cost 200 s before any
work, again in every command and twice where a command sizes the files in two places. Here:

* all HEADs of a call are in flight together, `concurrency` at a time, through the process's `RemoteReader` (its
  pool, retries, timeouts and redirect bound: `data.remote_concurrency`, `OLMO_DATA_REMOTE_*`);
* what a process learnt is kept in memory (`_MEMO`), so a second sizing of the same files asks nothing;
* what a HEAD said (size, ETag, Last-Modified) is kept on disk, for files that do not change once written (token
  files, their `.csv.gz` metadata, label masks in object storage): a later command asks nothing either.

The disk cache: `<cache>/remote-sizes/<sha256 of the folder's URL, 24 hex>.json` (`<cache>` is
`olmo_data.io.default_cache_dir()`: `$OLMO_DATA_CACHE`, else `$XDG_CACHE_HOME/olmo-data`, else
`~/.cache/olmo-data`), one JSON object per folder of files: `{"folder": URL, "files": {name: [size or null, etag,
last_modified, unix time stored]}}`; null records a probe that found no file (a token file without `.csv.gz`
metadata), and is trusted for `ABSENT_TTL_S` only, since metadata may be uploaded later. Each write reads the file
again, adds its entries and renames a temporary onto it (concurrent commands lose at most entries that are asked
again, never see half a file). A damaged file is ignored (and rewritten).

How an entry is invalidated: it is used without a request, and every ranged read of the file checks it for free
(`changed_since_sized`): the answer's total size (Content-Range) and its ETag and Last-Modified, where both the
answer and the entry have them, must be the entry's. If not, the entry is dropped (memory and disk) and that read
fails naming the URL: what was computed from the old size (instances, an order's length) may be wrong, so the
command is to be run again, and then sizes the file afresh. `OLMO_DATA_SIZE_CACHE=0` turns the disk cache off; to
clear it, delete `<cache>/remote-sizes/` (every file there can be deleted at any time).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmo_data.errors import DataError
from olmo_data.remote.ranges import content_range

if TYPE_CHECKING:
    from olmo_data.remote.reader import RemoteReader

ABSENT_TTL_S = 24 * 3600.0  # how long "no such file" is believed (a metadata file may be uploaded later)
PROGRESS_AFTER_S = 2.0  # a bar is drawn (on a terminal) once sizing has taken this long


@dataclass(frozen=True)
class RemoteStat:
    """What a HEAD said of a file: its size (None: no such file), and what tells a rewritten file from it."""

    size: int | None
    etag: str | None = None
    modified: str | None = None
    error: str | None = None  # why `size` is None, as the HEAD's failure said it (for the caller's error)


_MEMO: dict[str, RemoteStat] = {}  # this process's answers, by URL
_LOCK = threading.Lock()
_DISK: list[Path] = []  # the disk cache folders this process used (a stale entry is dropped from each)


def text(value: Any) -> str | None:
    """A header value as text (S3 gives Last-Modified as a datetime)."""
    return None if value is None else str(value)


def disk_cache_on() -> bool:
    return os.environ.get("OLMO_DATA_SIZE_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def stat_many(
    reader: RemoteReader,
    urls: Sequence[str],
    root: str | os.PathLike[str] | None,
    *,
    missing_ok: bool = False,
    progress: bool | None = None,
) -> dict[str, RemoteStat]:
    """The stat of each remote URL: from this process's memo, else the disk cache under `root` (None: none), else
    a HEAD, all of those `concurrency` at a time. A file that does not exist (404/403, NoSuchKey) gives a stat
    with size None; with `missing_ok` that absence is cached too (a probe for optional metadata), else it is
    not (the caller refuses the file, and a file uploaded later must be seen at once). Any other failure (a
    server that stays down) is raised as the reader raises it, naming the URL."""
    out, todo, cache = known_stats(urls, root)
    if not todo:
        return out
    fresh = {u: stat for u, (stat, _) in ask(reader, todo, progress).items()}
    keep(fresh, cache, missing_ok)
    out.update(fresh)
    return out


def known_stats(
    urls: Sequence[str], root: str | os.PathLike[str] | None
) -> tuple[dict[str, RemoteStat], list[str], Path | None]:
    """What is known of these URLs without a request (this process's memo, then the disk cache under `root`),
    the URLs still to ask, and the disk cache folder (None: off)."""
    wanted = list(dict.fromkeys(urls))
    with _LOCK:
        out = {u: _MEMO[u] for u in wanted if u in _MEMO}
    todo = [u for u in wanted if u not in out]
    cache = Path(root) / "remote-sizes" if root is not None and disk_cache_on() else None
    if cache is not None and cache not in _DISK:
        _DISK.append(cache)
    if cache is not None and todo:
        found = _read_cached(cache, todo)
        with _LOCK:
            _MEMO.update(found)
        out.update(found)
        todo = [u for u in todo if u not in found]
    return out, todo, cache


def keep(fresh: Mapping[str, RemoteStat], cache: Path | None, missing_ok: bool) -> None:
    """Remember stats just asked: in this process's memo, and on disk (absences only with `missing_ok`)."""
    with _LOCK:
        _MEMO.update(fresh)
    if cache is not None:
        _write_cached(cache, {u: s for u, s in fresh.items() if s.size is not None or missing_ok})


Attempt = Callable[[str], tuple[int, str | None, str | None, bytes | None]]


def ask(
    reader: RemoteReader, urls: list[str], progress: bool | None, attempt: Attempt | None = None
) -> dict[str, tuple[RemoteStat, bytes | None]]:
    """Ask each URL through the reader's pool and retries, a bar drawn if this takes more than a moment: a HEAD
    (`stat_once`), or `attempt(url)` giving (size, ETag, Last-Modified, bytes) from another request (`starts`)."""
    from olmo_data.display import progress_bar

    def head(url: str) -> tuple[int, str | None, str | None, bytes | None]:
        return (*reader.stat_once(url), None)

    how = attempt or head
    with progress_bar(
        total=len(urls), desc="sizing remote files", unit="files", progress=progress, delay=PROGRESS_AFTER_S
    ) as bar:

        def one(url: str) -> tuple[RemoteStat, bytes | None]:
            try:  # no shared batch: one missing file must not cancel the others' requests
                size, etag, modified, data = reader._with_retries(url, "size", partial(how, url), None)
                return RemoteStat(size, etag, modified), data
            except DataError as e:
                if not _absent(e):
                    raise
                return RemoteStat(None, error=str(e)), None
            finally:
                bar.update(1)

        tasks: list[Callable[[], tuple[RemoteStat, bytes | None]]] = [partial(one, u) for u in urls]
        return dict(zip(urls, reader._run(tasks), strict=True))


def _absent(error: BaseException) -> bool:
    """Whether a HEAD failed because the file is not there (HTTP 404, or 403 as S3 answers for a missing key to
    a caller who may not list the bucket; S3's 404/NoSuchKey): retrying cannot make it appear."""
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, FileNotFoundError) or getattr(current, "code", None) in (403, 404):
            return True
        response = getattr(current, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (403, 404) or response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return True
        current = current.__cause__ or current.__context__
    return False


def _folder(url: str) -> tuple[str, str]:
    folder, _, name = url.rpartition("/")
    return folder, name


def _shard(cache: Path, folder: str) -> Path:
    return cache / f"{hashlib.sha256(folder.encode()).hexdigest()[:24]}.json"


def _load(path: Path, folder: str) -> dict[str, list[Any]]:
    """One folder's entries; a missing, damaged or foreign file is no entries (it is only a cache)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("folder") != folder or not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


def _read_cached(cache: Path, urls: list[str]) -> dict[str, RemoteStat]:
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        by_folder.setdefault(_folder(u)[0], []).append(u)
    now = time.time()
    out: dict[str, RemoteStat] = {}
    for folder, members in by_folder.items():
        entries = _load(_shard(cache, folder), folder)
        for u in members:
            e = entries.get(_folder(u)[1])
            if not isinstance(e, list) or len(e) != 4:
                continue
            size, etag, modified, stored = e
            if size is None and now - float(stored or 0) > ABSENT_TTL_S:
                continue
            if size is not None and not (isinstance(size, int) and size >= 0):
                continue
            out[u] = RemoteStat(size, etag, modified, None if size is not None else f"{u}: no such file (cached)")
    return out


def _write_cached(cache: Path, stats: Mapping[str, RemoteStat], drop: Sequence[str] = ()) -> None:
    """Add `stats` to (and remove `drop` from) their folders' files, each rewritten atomically. A cache that
    cannot be written (a read-only home) is skipped: it only saves requests."""
    by_folder: dict[str, list[tuple[str, RemoteStat | None]]] = {}
    for u, stat in stats.items():
        by_folder.setdefault(_folder(u)[0], []).append((u, stat))
    for u in drop:
        by_folder.setdefault(_folder(u)[0], []).append((u, None))
    now = time.time()
    with contextlib.suppress(OSError):
        cache.mkdir(parents=True, exist_ok=True)
        for folder, members in by_folder.items():
            path = _shard(cache, folder)
            entries = _load(path, folder)
            for u, s in members:
                name = _folder(u)[1]
                if s is None:
                    entries.pop(name, None)
                else:
                    entries[name] = [s.size, s.etag, s.modified, now]
            fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=cache)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"folder": folder, "files": entries}, f, separators=(",", ":"))
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise


def changed_since_sized(url: str, answer: Mapping[str, Any]) -> str | None:
    """None when a ranged answer (HTTP headers, or S3's get_object dict) agrees with the stat this process holds
    for `url` (from the disk cache, or a HEAD earlier in the process), or there is none; else why not, after
    dropping the stale entry. Costs a dict look-up: the answer's headers came with the bytes."""
    with _LOCK:
        stat = _MEMO.get(url)
    if stat is None or stat.size is None:
        return None
    got = content_range(answer.get("Content-Range") or answer.get("ContentRange"))
    checks = [
        ("size", stat.size, got[2] if got else None),
        ("ETag", stat.etag, answer.get("ETag")),
        ("Last-Modified", stat.modified, text(answer.get("Last-Modified") or answer.get("LastModified"))),
    ]
    for what, cached, now in checks:
        if cached is not None and now is not None and str(cached) != str(now):
            forget(url)
            return (
                f"the file changed since its size was cached ({what} {cached} then, {now} now); what was computed "
                "from the old size may be wrong: run the command again (the stale cache entry is dropped)"
            )
    return None


def forget(url: str) -> None:
    """Drop `url`'s stat from this process's memo and from the disk cache."""
    with _LOCK:
        _MEMO.pop(url, None)
    for cache in list(_DISK):
        _write_cached(cache, {}, drop=[url])


def clear_memo() -> None:
    """Forget what this process learnt (tests; a long-lived process that wants fresh sizes)."""
    with _LOCK:
        _MEMO.clear()
