"""Remote reading: a list of (file, byte range) in, the bytes of each out, concurrently and with retries.

Why one module: a batch names thousands of scattered instances, and each remote instance is a ranged read. Made
one after another, each waits a full network round trip (2048 instances at 50 ms: 100 s); made many at a time
over kept-alive connections, the batch costs a few round trips. Ranges of one file that touch or nearly touch
are merged into one request first, so neighbouring instances cost one request. Everything that reads remote
bytes for the data path (instances, label masks, orders, manifests, document metadata) goes through here, so
every one of those reads is retried the same way.

Networks fail: a 503, a 429 asking to come back later, a connection reset mid-body, a body shorter (or longer)
than asked. Those are retried with exponential back-off and jitter, bounded in attempts and in total time, and
counted (`RemoteReader.retries`, which the trainer logs as a metric). A response whose length or range is not
the one asked for is never used. A failure that retrying cannot fix (404, a range past the end of the file), or the
last failed attempt, is a `DataError` naming the URL and the byte range. A stalled server fails its attempt after
`timeout_s` of silence; redirects are followed up to a bound, past which the request fails at once (a loop does not
end by retrying). urllib3's and botocore's own retries are off: they know nothing of a body of the wrong length,
count nothing we could log, and differ per scheme; one loop here serves every scheme the same way.

http(s):// goes through urllib3 pool managers whose connection pool per host is as large as the concurrency;
s3:// through one boto3 client (thread-safe, pool of the same size, its own retries off so that ours are the
only ones and are counted); anything else (gs://, ...) through smart-open, one seek per range.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, TypeVar

from olmo_data.errors import DataError
from olmo_data.remote.body import BodyTooLarge, Stream, check_cap, read_capped, read_slice
from olmo_data.remote.ranges import Range, coalesce, content_range, retry_after
from olmo_data.remote.sizes import changed_since_sized, text

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}  # and every other 5xx


@dataclass(frozen=True)
class RemoteOptions:
    """How remote reads behave. The defaults suit a data centre and the public internet alike; tests shrink the
    retry timing so that a server that stays down fails a test in a fraction of a second."""

    concurrency: int = 64  # requests in flight at once (and connections per host)
    attempts: int = 10  # per request, the first one included (the delays add up to about 30 s)
    backoff_s: float = 0.1  # delay before the first retry, doubled after each one (times a jitter of 0.5-1)
    max_backoff_s: float = 10.0  # cap of one delay, Retry-After included
    deadline_s: float = 120.0  # a request is given up once it has been tried for this long
    timeout_s: float = 60.0  # connect timeout, and longest silence while reading, of one attempt
    redirects: int = 5  # HTTP redirects followed per request; more is a loop (or a chain), refused at once
    coalesce_gap: int = 64 * 1024  # merge ranges of a file separated by at most this many bytes...
    max_request_bytes: int = 16 * 2**20  # ...while the merged request stays this small
    cache_entries: int = 4096  # recently read ranges kept in memory (repeated looks at a batch are free)
    cache_bytes: int = 64 * 2**20
    whole_file_bytes: int = 256 * 2**20  # a whole file read into memory (a manifest, a side file): at most this

    @classmethod
    def from_env(cls) -> RemoteOptions:
        """The defaults, changed by `OLMO_DATA_REMOTE_<FIELD>` variables (`OLMO_DATA_REMOTE_CONCURRENCY=128`), so
        that one setting reaches every process of a torchrun job or a command without a flag."""
        defaults, changes = cls(), {}
        for f in fields(cls):
            name = f"OLMO_DATA_REMOTE_{f.name.upper()}"
            if (value := os.environ.get(name)) is not None:
                try:
                    changes[f.name] = type(getattr(defaults, f.name))(value)
                except ValueError as e:
                    raise DataError(f"{name}={value!r}: expected a number like {getattr(defaults, f.name)}") from e
        return cls(**changes)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.attempts < 1 or self.redirects < 0 or self.timeout_s <= 0:
            raise DataError(
                f"remote reads need concurrency >= 1, attempts >= 1, redirects >= 0 and timeout_s > 0, got {self}"
            )


class Transient(Exception):
    """A failure that may not happen again: worth another attempt."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Permanent(Exception):
    """A failure that retrying cannot fix (a missing file, a range past its end)."""


class HTTPStatusError(Exception):
    """An HTTP error status, as the cause of a permanent failure: `code` tells a missing file from others."""

    def __init__(self, code: int, url: str) -> None:
        super().__init__(f"HTTP {code} for {url}")
        self.code = code


class _Cancelled(Exception):
    """Another request of the same batch failed for good: stop early, the batch is lost anyway."""


@dataclass
class _Batch:
    """What the requests of one call share: a cancel signal, and the retries they needed (for its log line)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    retries: Counter[str] = field(default_factory=Counter)


class RemoteReader:
    """Concurrent, retried, coalesced ranged reads with a small LRU cache. Thread-safe; one per process
    (`remote_reader()`) shares its connection pools and cache among all users."""

    def __init__(self, options: RemoteOptions | None = None) -> None:
        self.options = options or RemoteOptions()
        self._cache: OrderedDict[Range, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pools: dict[str | None, Any] = {}  # urllib3 pool managers, by proxy
        self._proxies: dict[tuple[str, str], str | None] = {}  # (scheme, host): its proxy
        self._s3: dict[str | None, Any] = {}  # boto3 clients, by endpoint
        self.requests = 0  # requests that brought their bytes (tests count coalescing and the cache with it)
        self.retries = 0  # failed attempts that were tried again (the trainer logs it as a metric)
        self.retry_reasons: Counter[str] = Counter()

    # -- public API ------------------------------------------------------------------------------------------

    def read(self, url: str, start: int, length: int) -> bytes:
        """`length` bytes of `url` from byte `start`."""
        return self.read_many([(url, start, length)])[0]

    def read_many(self, ranges: Sequence[Range]) -> list[bytes]:
        """The bytes of each (url, start, length), in the order given; neighbouring ranges of a file are
        fetched as one request, and all requests run `concurrency` at a time."""
        out: list[bytes | None] = [None] * len(ranges)
        missing: list[int] = []
        with self._lock:
            for i, key in enumerate(ranges):
                if key[2] == 0:
                    out[i] = b""
                elif key in self._cache:
                    self._cache.move_to_end(key)
                    out[i] = self._cache[key]
                else:
                    missing.append(i)
        requests = coalesce([ranges[i] for i in missing], self.options.coalesce_gap, self.options.max_request_bytes)
        batch = _Batch()
        fetched = self._run([partial(self._fetch_with_retries, *r, batch) for r, _ in requests])
        with self._lock:
            for ((_, start, _), members), data in zip(requests, fetched, strict=True):
                for k in members:
                    i = missing[k]
                    _, s, n = ranges[i]
                    out[i] = data[s - start : s - start + n]
                    self._remember(ranges[i], out[i])  # type: ignore[arg-type]
        if batch.retries:
            log.warning(
                "remote reads: %d requests for %d ranges needed %d retries (%s); every byte arrived complete",
                len(requests),
                len(missing),
                sum(batch.retries.values()),
                ", ".join(f"{reason} x{n}" for reason, n in batch.retries.most_common()),
            )
        return [b if b is not None else b"" for b in out]

    def size(self, url: str) -> int:
        """The size in bytes of a remote file (one HEAD request, retried)."""
        return self.sizes([url])[0]

    def sizes(self, urls: Sequence[str]) -> list[int]:
        """The sizes of many remote files, their HEAD requests in flight together."""
        batch = _Batch()
        tasks = [partial(self._with_retries, u, "size", partial(self.stat_once, u), batch) for u in urls]
        return [stat[0] for stat in self._run(tasks)]

    def read_all(self, url: str, max_bytes: int | None = None) -> bytes:
        """A whole (small) remote file: manifests, side files. A body of another length than the server
        announced is retried like a short range; one announced or growing past `max_bytes` (`whole_file_bytes`
        unless given) is refused naming the URL, so a lying server cannot fill the memory."""
        cap = self.options.whole_file_bytes if max_bytes is None else max_bytes
        return self._with_retries(url, "read", partial(self._read_all_once, url, cap), None)

    def download(
        self,
        url: str,
        destination: str | os.PathLike[str] | Callable[[bytes], Any],
        chunk_bytes: int = 8 * 2**20,
        max_bytes: int | None = None,
    ) -> None:
        """Copy a remote file to a path, or its bytes in order to a `write` function, in ranged chunks, `concurrency`
        at a time, each retried on its own (a reset costs one chunk); memory stays under `concurrency` chunks; a
        server that ignores `Range` is streamed from its first answer once. Over `max_bytes`: refused naming the URL."""
        if isinstance(destination, (str, os.PathLike)):
            with open(destination, "wb") as f:
                return self.download(url, f.write, chunk_bytes, max_bytes)
        total = self.size(url)
        if max_bytes is not None and total > max_bytes:
            raise DataError(f"{url}: download refused ({BodyTooLarge(total, max_bytes)}); is this the right URL?")
        begin = 0
        if total > chunk_bytes and url.startswith(("http://", "https://")):  # the first chunk alone: is Range heard?
            stream = Stream(destination, total)
            first = partial(self._http_range, url, 0, chunk_bytes, stream)
            block = self._with_retries(url, f"ranged read of bytes 0..{chunk_bytes - 1}", first, None)
            with self._lock:
                self.requests += 1
            if stream.done:  # a 200: the whole file came, streamed to `destination`
                return None
            destination(block)
            begin = chunk_bytes
        window = max(1, self.options.concurrency) * chunk_bytes
        for lo in range(begin, total, window):
            hi = min(total, lo + window)
            spans = [(url, s, min(chunk_bytes, hi - s)) for s in range(lo, hi, chunk_bytes)]
            batch = _Batch()
            for block in self._run([partial(self._fetch_with_retries, *r, batch) for r in spans]):
                destination(block)

    def stats(self) -> dict[str, int]:
        """Counters to log: requests that succeeded and failed attempts that were retried."""
        return {"requests": self.requests, "retries": self.retries}  # (two ints: read without the lock)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- running many at once --------------------------------------------------------------------------------

    def _run(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Run the tasks `concurrency` at a time and return their results in order; the first failure cancels
        the tasks not yet started and is raised. One task runs in the calling thread (no hand-over)."""
        if len(tasks) == 1 or self.options.concurrency == 1:
            return [t() for t in tasks]
        if not tasks:
            return []
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.options.concurrency, thread_name_prefix="olmo-remote")
            pool = self._pool
        futures: list[Future[T]] = [pool.submit(t) for t in tasks]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        if pending:  # a failure: drop what has not started, let the running ones see the cancel and stop
            for f in pending:
                f.cancel()
            wait(futures)
        errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, _Cancelled)), errors[0])
        return [f.result() for f in futures]

    # -- one request, retried --------------------------------------------------------------------------------

    def _fetch_with_retries(self, url: str, start: int, length: int, batch: _Batch) -> bytes:
        end = start + length - 1
        data = self._with_retries(
            url, f"ranged read of bytes {start}..{end}", lambda: self._fetch(url, start, length), batch
        )
        with self._lock:
            self.requests += 1
        return data

    def _with_retries(self, url: str, what: str, attempt: Callable[[], T], batch: _Batch | None) -> T:
        """`attempt()` until it succeeds, retrying transient failures with exponential back-off and jitter."""
        try:
            return self._attempts(url, what, attempt, batch)
        except DataError:
            if batch is not None:
                batch.cancel.set()  # the batch is lost: its other requests need not go on
            raise

    def _attempts(self, url: str, what: str, attempt: Callable[[], T], batch: _Batch | None) -> T:
        opts = self.options
        began = time.monotonic()
        for n in range(1, opts.attempts + 1):
            if batch is not None and batch.cancel.is_set():
                raise _Cancelled(url)
            try:
                return attempt()
            except Permanent as e:
                raise DataError(f"{url}: {what} failed ({e})") from e.__cause__
            except Transient as e:
                delay = min(opts.max_backoff_s, opts.backoff_s * 2 ** (n - 1)) * random.uniform(0.5, 1.0)
                if e.retry_after is not None:
                    delay = max(delay, min(e.retry_after, opts.max_backoff_s))
                elapsed = time.monotonic() - began
                if n == opts.attempts or elapsed + delay > opts.deadline_s:
                    raise DataError(
                        f"{url}: {what} failed after {n} attempts in {elapsed:.1f} s (last: {e.reason}); the server "
                        "is down or failing: check it and rerun (a training run resumes from its last checkpoint)"
                    ) from e.__cause__
                reason = e.reason.split(" (")[0]
                with self._lock:
                    self.retries += 1
                    self.retry_reasons[reason] += 1
                    if batch is not None:
                        batch.retries[reason] += 1
                log.debug(
                    "%s: %s failed (%s); attempt %d of %d in %.2f s", url, what, e.reason, n + 1, opts.attempts, delay
                )
                if batch is not None:
                    batch.cancel.wait(delay)
                else:
                    time.sleep(delay)
        raise AssertionError("unreachable")

    def _remember(self, key: Range, data: bytes) -> None:
        """Keep a range in the LRU cache (caller holds the lock)."""
        if key in self._cache or len(data) > self.options.cache_bytes:
            return
        self._cache[key] = data
        self._cached_bytes += len(data)
        while len(self._cache) > self.options.cache_entries or self._cached_bytes > self.options.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)

    # -- one attempt, per scheme -----------------------------------------------------------------------------

    def _fetch(self, url: str, start: int, length: int) -> bytes:
        if url.startswith(("http://", "https://")):
            return self._http_range(url, start, length)
        if url.startswith("s3://"):
            return self._s3_range(url, start, length)
        return self._smart_open_range(url, start, length)

    def _http(self, url: str) -> Any:
        """The connection pool manager for `url`: one per proxy (the environment's, as curl and requests honour
        it), each keeping up to `concurrency` kept-alive connections per host. urllib3 rather than requests:
        it costs half the CPU per request, which bounds a batch of thousands of small reads."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        host = (parts.scheme, parts.hostname or "")
        if host not in self._proxies:  # the environment is read once per host: it costs more than a request
            import urllib.request

            proxy = urllib.request.getproxies().get(parts.scheme)
            self._proxies[host] = None if not proxy or urllib.request.proxy_bypass(host[1]) else proxy
        proxy = self._proxies[host]
        with self._lock:
            if proxy not in self._pools:
                import urllib3

                kw: dict[str, Any] = dict(
                    num_pools=32,
                    maxsize=self.options.concurrency,
                    block=True,
                    timeout=urllib3.Timeout(connect=self.options.timeout_s, read=self.options.timeout_s),
                    # no retries of its own (ours are counted and logged), but redirects are followed, up to a
                    # bound past which the last 3xx is returned to us (_http_request names it, unretried)
                    retries=urllib3.Retry(
                        total=None,
                        connect=0,
                        read=0,
                        status=0,
                        other=0,
                        redirect=self.options.redirects,
                        raise_on_redirect=False,
                    ),
                )
                self._pools[proxy] = urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw)
            return self._pools[proxy]

    def _http_request(
        self, method: str, url: str, headers: dict[str, str], read: Callable[[Any], bytes] | None = None
    ) -> tuple[int, Any, bytes]:
        """One request: (status, headers, body), its failures sorted into transient and permanent ones. A 200's
        body is read by `read` when given (`remote_body`: a slice of a whole file that ignored our Range, those
        bytes before it dropped as they come; a stream; a whole file refused past its cap)."""
        import urllib3

        try:
            # identity: a compressed body would have another length than the range asked for
            r = self._http(url).request(
                method, url, headers={"Accept-Encoding": "identity", **headers}, preload_content=False
            )
            try:
                location = r.get_redirect_location()  # a redirect still to follow once the bound is spent
                if r.status >= 400 or location:
                    r.drain_conn()  # a connection goes back to the pool only once its response is read
                if location:  # a loop gives the same answer next time: not retried
                    raise Permanent(
                        f"too many redirects ({self.options.redirects}), the last to {location}: a redirect loop, or "
                        "a chain longer than OLMO_DATA_REMOTE_REDIRECTS"
                    )
                if r.status in RETRY_STATUS or r.status >= 500:
                    raise Transient(f"HTTP {r.status}", retry_after(r.headers.get("Retry-After")))
                if r.status >= 400:  # the cause's `code` tells "not found" (manifest.is_not_found_error)
                    raise Permanent(f"HTTP {r.status} {r.reason}") from HTTPStatusError(r.status, url)
                if r.status == 200 and read is not None:
                    try:
                        body = read(r)
                    finally:  # what is left is not wanted (or refused): drop the connection, not read it
                        if r.length_remaining != 0:
                            r.close()
                    return r.status, r.headers, body
                return r.status, r.headers, r.read()  # urllib3 raises on a body shorter than Content-Length
            finally:
                r.release_conn()
        except BodyTooLarge as e:
            raise Permanent(str(e)) from e
        except ValueError as e:  # a streamed body of another length than the file's
            raise Transient(str(e)) from e
        except urllib3.exceptions.LocationValueError as e:
            raise Permanent(f"{type(e).__name__}: {e}") from e
        except urllib3.exceptions.HTTPError as e:  # refused, reset, timed out, or a body cut short
            reason = getattr(e, "reason", None) or e
            refused = isinstance(reason, urllib3.exceptions.NewConnectionError)  # (a ConnectTimeoutError subclass)
            if isinstance(reason, urllib3.exceptions.TimeoutError) and not refused:  # stalled: say how long we waited
                raise Transient(f"no answer for {self.options.timeout_s:g} s ({type(reason).__name__})") from e
            raise Transient(f"connection failed ({type(reason).__name__})") from e

    def _http_range(self, url: str, start: int, length: int, stream: Stream | None = None) -> bytes:
        """Bytes `start`.. of `url`; a 200 (Range ignored) gives our slice of it, or all of it to `stream`."""
        end = start + length - 1  # HTTP and S3 ranges are inclusive
        read = stream or partial(read_slice, start=start, length=length)
        status, headers, body = self._http_request("GET", url, {"Range": f"bytes={start}-{end}"}, read)
        if status == 200 and stream is not None:
            return body
        if stream is not None and stream.done:  # a 200 cut short, retried, then a 206: bytes were given already
            raise Permanent("the server answered the same request with the whole file, then with a range")
        if status == 200:  # a server that ignores Range sends the whole file: read_slice kept our slice
            if len(body) < length:
                raise Permanent(f"the file holds {start + len(body)} bytes, fewer than the {end + 1} needed")
            return body
        if status != 206:
            raise Transient(f"HTTP {status} to a ranged GET")
        _check_range(headers.get("Content-Range"), "206 without a readable Content-Range", start, end)
        if changed := changed_since_sized(url, headers):  # the size cache's entry was of another file
            raise Permanent(changed)
        if len(body) != length:
            raise Transient(f"{'short' if len(body) < length else 'long'} body ({len(body)} of {length} bytes)")
        return body

    def _read_all_once(self, url: str, cap: int) -> bytes:
        if url.startswith(("http://", "https://")):
            return self._http_request("GET", url, {}, partial(read_capped, cap=cap))[2]
        if url.startswith("s3://"):
            bucket, key = url[5:].split("/", 1)
            obj = self._s3_call(lambda: self._s3_client().get_object(Bucket=bucket, Key=key))
            try:
                check_cap(int(obj.get("ContentLength") or 0), cap)
            except BodyTooLarge as e:
                raise Permanent(str(e)) from e
            return self._s3_call(lambda: self._s3_body(obj))
        body = self._smart_open_call(url, lambda f: bytes(f.read(cap + 1)))
        if len(body) > cap:
            raise Permanent(str(BodyTooLarge(None, cap)))
        return body

    def stat_once(self, url: str) -> tuple[int, str | None, str | None]:
        """One attempt at (size, ETag, Last-Modified): the size cache (`sizes`) keeps all three."""
        if url.startswith(("http://", "https://")):
            _, headers, _ = self._http_request("HEAD", url, {})
            if headers.get("Content-Length") is None:
                raise Permanent("the server does not say the file's size (no Content-Length)")
            return int(headers["Content-Length"]), headers.get("ETag"), headers.get("Last-Modified")
        if url.startswith("s3://"):
            bucket, key = url[5:].split("/", 1)
            head = self._s3_call(lambda: self._s3_client().head_object(Bucket=bucket, Key=key))
            return int(head["ContentLength"]), head.get("ETag"), text(head.get("LastModified"))
        return self._smart_open_call(url, lambda f: int(f.seek(0, os.SEEK_END))), None, None

    def _s3_client(self) -> Any:
        """A boto3 client for $AWS_ENDPOINT_URL (one per endpoint: a process may point it elsewhere later)."""
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
        with self._lock:
            if endpoint not in self._s3:
                import boto3
                from botocore.config import Config

                config = Config(
                    max_pool_connections=self.options.concurrency,
                    retries={"total_max_attempts": 1},  # ours are counted and logged; boto's would hide failures
                    connect_timeout=self.options.timeout_s,
                    read_timeout=self.options.timeout_s,
                )
                self._s3[endpoint] = boto3.client("s3", endpoint_url=endpoint, config=config)
            return self._s3[endpoint]

    def _s3_range(self, url: str, start: int, length: int) -> bytes:
        bucket, key = url[5:].split("/", 1)
        end = start + length - 1
        obj = self._s3_call(lambda: self._s3_client().get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}"))
        _check_range(obj.get("ContentRange"), "ranged GET answered without a readable ContentRange", start, end)
        if changed := changed_since_sized(url, obj):
            raise Permanent(changed)
        body = self._s3_call(lambda: self._s3_body(obj))
        if len(body) != length:
            raise Transient(f"{'short' if len(body) < length else 'long'} body ({len(body)} of {length} bytes)")
        return body

    @staticmethod
    def _s3_body(obj: dict[str, Any]) -> bytes:
        body = bytes(obj["Body"].read())
        announced = obj.get("ContentLength")
        if announced is not None and int(announced) != len(body):
            raise Transient(f"body length {len(body)} != ContentLength {announced}")
        return body

    @staticmethod
    def _s3_call(call: Callable[[], T]) -> T:
        """`call()`, with botocore's errors sorted into transient (throttling, 5xx, connections) and permanent."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError

        try:
            return call()
        except ClientError as e:
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            code = str(e.response.get("Error", {}).get("Code", ""))
            if status in RETRY_STATUS or status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                hint = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("retry-after")
                raise Transient(f"S3 {code or status}", retry_after(hint)) from e
            raise Permanent(f"ClientError: {e}") from e
        except (NoCredentialsError, ParamValidationError) as e:
            raise Permanent(f"{type(e).__name__}: {e}") from e
        except BotoCoreError as e:  # connection errors, timeouts, a body cut short
            raise Transient(f"connection failed ({type(e).__name__})") from e

    def _smart_open_range(self, url: str, start: int, length: int) -> bytes:
        def read(f: Any) -> bytes:
            f.seek(start)
            return bytes(f.read(length))

        body = self._smart_open_call(url, read)
        if len(body) != length:
            raise Transient(f"short body ({len(body)} of {length} bytes)")
        return body

    @staticmethod
    def _smart_open_call(url: str, use: Callable[[Any], T]) -> T:
        """gs:// and other schemes through smart-open; only a missing file or a refusal counts as permanent."""
        import smart_open

        try:
            with smart_open.open(url, "rb", compression="disable") as f:
                return use(f)
        except (FileNotFoundError, PermissionError, ValueError) as e:
            raise Permanent(f"{type(e).__name__}: {e}") from e
        except Exception as e:
            if getattr(e, "code", None) in (401, 403, 404):  # google.api_core NotFound / Forbidden
                raise Permanent(f"{type(e).__name__}: {e}") from e
            raise Transient(f"{type(e).__name__}: {e}") from e


def _check_range(header: str | None, missing: str, start: int, end: int) -> None:
    """The bytes of a ranged read must say which they are (RFC 9110; S3 alike): without a readable range, or with
    another one, they may be any bytes of the file and are never used; a range cut by the file's end is final."""
    got = content_range(header)
    if got is None:
        raise Transient(f"{missing} ({header!r})")
    if got[2] is not None and got[2] <= end:
        raise Permanent(f"the file holds {got[2]} bytes, fewer than the {end + 1} needed")
    if (got[0], got[1]) != (start, end):
        raise Transient(f"wrong range (server sent bytes {got[0]}-{got[1]})")


_READER: RemoteReader | None = None
_READER_LOCK = threading.Lock()


def remote_reader() -> RemoteReader:
    """The process-wide reader: one connection pool per host, one cache, one retry count."""
    global _READER
    with _READER_LOCK:
        if _READER is None:
            _READER = RemoteReader(RemoteOptions.from_env())
        return _READER


def configure(**options: Any) -> RemoteReader:
    """Replace the process-wide reader by one with these `RemoteOptions` changed (the CLI's and the trainer's
    settings), e.g. `configure(concurrency=128, deadline_s=600)`."""
    global _READER
    with _READER_LOCK:
        base = _READER.options if _READER is not None else RemoteOptions.from_env()
        if _READER is not None:
            _READER.close()
        _READER = RemoteReader(replace(base, **options))
        return _READER


def _forget_after_fork() -> None:
    """A forked child cannot use its parent's pool threads or connections: it starts a reader of its own."""
    globals()["_READER"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
