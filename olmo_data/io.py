"""Local and remote file access, and atomic writes.

Remote reads go through smart-open (s3://, gs://, http(s)://) so that one code path serves every location.
Writes only ever go to local paths, under a temporary name that is renamed into place when complete, so a killed
job never leaves a file that looks finished but is not.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import gzip
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from olmo_data.errors import DataError, yaml_problem
from olmo_data.interrupts import signals_deferred
from olmo_data.remote import RemoteStat, remote_reader, stat_and_start_many, stat_many

T = TypeVar("T")

REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "http://", "https://")


def default_cache_dir() -> str:
    """Where derived files are kept (document indexes, fetched orders, checked tokenizers, downloaded checkpoints,
    remote files' sizes): $OLMO_DATA_CACHE, else $XDG_CACHE_HOME/olmo-data, else ~/.cache/olmo-data. Everything
    there can be deleted at any time; it is rebuilt on demand."""
    if explicit := os.environ.get("OLMO_DATA_CACHE"):
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "olmo-data")


def hub_offline_mode() -> bool:
    """HF_HUB_OFFLINE is set: the hub client then serves what its cache holds, at once, without the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds. Asked before loading by hub
    id: offline, the hub client retries for half a minute, printing a warning each time, before it gives up."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def is_remote(path: str | os.PathLike[str]) -> bool:
    return str(path).startswith(REMOTE_SCHEMES)


def open_file(path: str, mode: str = "rb", *, compression: str = "infer_from_extension") -> IO[Any]:
    """Open a local or remote file; `.gz`/`.zst`/`.bz2` are decompressed on the fly (by extension)."""
    if not is_remote(path):
        if "r" in mode and not os.path.exists(path):
            raise DataError(f"{path}: file not found")
        # local plain and gzip files skip smart-open, whose import pulls in every cloud SDK (~0.75 s)
        if compression == "disable" or not path.endswith((".gz", ".zst", ".zstd", ".bz2")):
            return open(path, mode)  # noqa: SIM115
        if path.endswith(".gz"):
            return gzip.open(path, mode)  # type: ignore[return-value]
    import smart_open

    params = {}
    if path.startswith(("http://", "https://")):  # a streamed read stalls no longer than a ranged one
        params = {"timeout": remote_reader().options.timeout_s}
    try:
        return smart_open.open(path, mode, compression=compression, transport_params=params)  # type: ignore[no-any-return]
    except DataError:
        raise
    except Exception as e:  # remote errors come in many types; name the path in all of them
        raise DataError(f"{path}: cannot open ({type(e).__name__}: {e})") from e


def file_size(path: str) -> int:
    """Size in bytes of a local or remote file (remote: as `file_sizes` finds it)."""
    if not is_remote(path):
        return os.path.getsize(path)
    size = file_sizes([path])[0]
    assert size is not None
    return size


def file_sizes(paths: Sequence[str], *, missing_ok: bool = False, progress: bool | None = None) -> list[int | None]:
    """Sizes in bytes of many local or remote files, in order. Remote ones are asked at once, `concurrency` at a
    time, at most once per process, and kept in the cache for later commands (`olmo_data.remote.sizes` says where,
    how a changed file is noticed, and how to clear it). A missing file is a DataError naming it, or None with
    `missing_ok` (a probe for optional metadata)."""
    out: list[int | None] = [None] * len(paths)
    remote = [p for p in paths if is_remote(p)]
    stats = {}
    if remote:
        stats = _asked(
            remote, lambda root: stat_many(remote_reader(), remote, root, missing_ok=missing_ok, progress=progress)
        )
    for i, p in enumerate(paths):
        if not is_remote(p):
            if missing_ok and not os.path.exists(p):
                continue
            out[i] = os.path.getsize(p)
            continue
        stat = stats[p]
        if stat.size is None and not missing_ok:
            raise DataError(stat.error or f"{p}: no such file")
        out[i] = stat.size
    return out


def remote_stats_and_starts(urls: list[str], length: int) -> tuple[dict[str, RemoteStat], dict[str, bytes]]:
    """The stats of remote files, as `file_sizes` keeps them (a missing file's size None, cached), and the first
    `length` bytes of those that had to be asked, from the same ranged GETs (`olmo_data.remote.starts`): how a
    remote document index is sized and its head read in one request."""
    return _asked(urls, lambda root: stat_and_start_many(remote_reader(), urls, length, root))


_HEAD_SCHEMES = ("s3://", "http://", "https://")  # sized by one retried request each; and cached (others: not)


def _asked(remote: Sequence[str], ask: Callable[[str | None], T]) -> T:
    """`ask(root)` with the size cache's root (None for schemes it does not cache), its failures DataErrors that
    name a path (botocore's, requests' and gcs' errors do not)."""
    try:
        return ask(default_cache_dir() if all(p.startswith(_HEAD_SCHEMES) for p in remote) else None)
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{remote[0]}: cannot read ({type(e).__name__}: {e})") from e


def read_bytes(path: str) -> bytes:
    """A whole small file (a manifest, a side file), local or remote; remote reads are retried like every
    ranged read (`olmo_data.remote`), and a body of the wrong length is never returned."""
    if not is_remote(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError as e:
            raise DataError(f"{path}: file not found") from e
    return remote_reader().read_all(path)


@contextlib.contextmanager
def local_copy(path: str, directory: str | os.PathLike[str]) -> Iterator[str]:
    """A local path holding `path`'s bytes: `path` itself when local, else a download into `directory` (ranged,
    concurrent and retried, by `olmo_data.remote`) that is removed afterwards. The copy keeps the file's name
    ending, so `open_file` still decompresses it by extension."""
    if not is_remote(path):
        yield path
        return
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-download.", suffix="-" + path.rsplit("/", 1)[-1], dir=directory)
    os.close(fd)
    try:
        remote_reader().download(path, tmp)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def cached_download(url: str, version: str = "") -> Path:
    """A local copy of the remote file `url` in the cache ($OLMO_DATA_CACHE/downloads), fetched by
    `olmo_data.remote` (a stalled server times out, retries are counted and bounded, redirects too) under a
    temporary name renamed when complete, so a file under its own name there is always whole. A copy is reused
    while the remote file keeps its size (one HEAD request) and `version` (what the caller knows of the file's
    identity, e.g. an order's side file) is the same: a file rewritten in place at the same size is otherwise not
    noticed, which suits checkpoints and models, written once."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    key = hashlib.sha256(f"{url}\n{version}".encode() if version else url.encode()).hexdigest()[:16]
    target = Path(default_cache_dir()) / "downloads" / f"{key}-{name}"
    reader = remote_reader()
    if target.is_file() and target.stat().st_size == reader.size(url):
        return target
    with atomic_path(target) as tmp:
        reader.download(url, tmp)
    return target


def s3_client() -> Any:
    """A boto3 S3 client that honours AWS_ENDPOINT_URL (used by tests with a loopback S3 server)."""
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)


def expand_patterns(patterns: Sequence[str]) -> list[str]:
    """Expand local globs (sorted) and s3:// globs; keep other paths as given, in the order given.

    A pattern that matches nothing is an error: silently tokenizing zero files is never what the user meant.
    Duplicates are dropped (first occurrence kept) so a file is never read twice.
    """
    out: list[str] = []
    for pattern in patterns:
        pattern = str(pattern)
        has_glob = any(c in pattern for c in "*?[")
        if is_remote(pattern):
            if has_glob and pattern.startswith("s3://"):
                matches = _s3_glob(pattern)
            elif has_glob:
                raise DataError(f"{pattern}: globs are supported for local and s3:// paths only; list the files")
            else:
                matches = [pattern]
        elif has_glob:
            matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        else:
            matches = [os.path.expanduser(pattern)]
            if not os.path.exists(matches[0]):
                raise DataError(f"{pattern}: file not found")
            if os.path.isdir(matches[0]):
                raise DataError(f"{pattern}: is a directory; give a glob such as '{pattern.rstrip('/')}/*.jsonl.gz'")
        if not matches:
            raise DataError(f"{pattern}: the pattern matches no file")
        out.extend(matches)
    return list(dict.fromkeys(out))


def _s3_glob(pattern: str) -> list[str]:
    bucket, key_pattern = pattern[5:].split("/", 1)
    prefix = key_pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    paginator = s3_client().get_paginator("list_objects_v2")
    keys: list[str] = []
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", []) if fnmatch.fnmatchcase(obj["Key"], key_pattern))
    return [f"s3://{bucket}/{k}" for k in sorted(keys)]


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it onto `final` only if the block completes.

    The temporary name starts with `.tmp-` so readers and reruns never mistake it for output.
    On any exception the temporary file is removed, so no partial output is left behind.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():  # a SIGTERM between creating the file and recording it would leave it behind
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        _LIVE_TEMPORARIES.add(tmp_path)
    try:
        yield tmp_path
        usual_mode(tmp_path)  # mkstemp makes 0600
        os.replace(tmp_path, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    finally:
        _LIVE_TEMPORARIES.discard(tmp_path)


# Temporaries `atomic_path` made and has not yet renamed or removed. Its own cleanup covers every exception raised
# within its block; a signal that arrives after it yielded but before the caller's `with` (or ExitStack) took hold
# of it is not covered, so a command stopped by a signal removes what is left here (`remove_live_temporaries`).
_LIVE_TEMPORARIES: set[Path] = set()


def remove_live_temporaries() -> int:
    """Remove every temporary of `atomic_path` in this process that is neither renamed nor removed yet; returns how
    many. For the cleanup of a command stopped by a signal."""
    removed = 0
    for path in list(_LIVE_TEMPORARIES):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
        _LIVE_TEMPORARIES.discard(path)
    return removed


def usual_mode(path: str | os.PathLike[str]) -> None:
    """Give a finished file the permissions a plain `open` would (0666 less the umask): writers that go through a
    private temporary file (mkstemp, safetensors) leave 0600, so one output file of many would be unreadable to
    the rest of a team."""
    os.chmod(path, 0o666 & ~_UMASK)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def gzip_writer(path: str | os.PathLike[str]) -> gzip.GzipFile:
    """A binary gzip writer with a fixed header (no file name, mtime 0), so equal content gives equal bytes.

    Closing it closes the file too.
    """
    raw = open(path, "wb")  # noqa: SIM115 - closed by the GzipFile
    gz = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="", compresslevel=6)
    gz.myfileobj = raw  # type: ignore[assignment]  # what GzipFile closes when it opened the file itself
    return gz


def gzip_text_writer(path: str | os.PathLike[str]) -> io.TextIOWrapper:
    """`gzip_writer` as UTF-8 text with newlines written as given (for csv)."""
    return io.TextIOWrapper(gzip_writer(path), encoding="utf-8", newline="")


def read_yaml(path: str, what: str) -> Any:
    """A local YAML file's content; a missing file or bad YAML is a DataError naming `what` it should have been."""
    import yaml

    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except FileNotFoundError as e:
        raise DataError(f"{path}: {what} not found") from e
    except yaml.YAMLError as e:
        raise DataError(f"{path}: not valid YAML ({yaml_problem(e)})") from e
    except RecursionError as e:
        raise DataError(f"{path}: nested too deeply to read (thousands of levels)") from e


@contextlib.contextmanager
def parquet_file(path: str) -> Iterator[Any]:
    """An open `pyarrow.parquet.ParquetFile` of a local or remote file; unreadable ones are a DataError."""
    import pyarrow.parquet as pq

    with open_file(path, "rb", compression="disable") as f:
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:
            raise DataError(f"{path}: not a readable parquet file ({e})") from e
        yield pf


def json_bytes(obj: Any) -> bytes:
    """JSON as this project writes it (sorted keys, indented, trailing newline), so equal content gives equal
    bytes; also for callers that must know the bytes before writing them (to record their checksum)."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `json_bytes(obj)` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(json_bytes(obj))


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open_file(path, "rb", compression="disable") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def remove_stale_temporaries(directory: str | os.PathLike[str], of: Sequence[str] | None = None) -> int:
    """Delete `.tmp-*` leftovers of a killed run; returns how many were removed. With `of` (file names), only the
    temporaries of those files (`atomic_path`'s `.tmp-NAME.*`): where other processes may be writing the rest now."""
    n = 0
    patterns = [".tmp-*"] if of is None else [f".tmp-{glob.escape(name)}.*" for name in of]
    for p in (found for pattern in patterns for found in Path(directory).glob(pattern)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n
