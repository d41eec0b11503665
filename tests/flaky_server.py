"""A loopback HTTP file server that misbehaves on purpose: latency, limited bandwidth, and failures.

It serves a directory with Range support over kept-alive HTTP/1.1 connections, like an object store's HTTP
front, and can add to every request a fixed latency, a bandwidth limit, and, at a given rate, one of these
faults:

- `503`: Service Unavailable, no Retry-After;
- `503-retry-after` / `429`: with a `Retry-After` header (seconds, `Faults.retry_after`);
- `drop`: the connection is closed before any response is sent;
- `truncate`: the headers announce the whole body, half of it is sent, and the connection is closed;
- `short` / `long`: a complete response whose body is one byte shorter / longer than the range asked for.

Which request fails is decided by hashing the seed, the request (method, path, Range) and how many times that
request was seen before, so a run's faults do not depend on thread timing: the same client reads meet the same
faults under the same seed. `Faults.down` makes every request fail with a 503 (a server that stays down), and
`Faults.down_after` does so from the n-th request on (a server that goes down in the middle of a run).

Faults of chosen files, by the end of their path (`""` names every file): `stall` sends the headers and half the
body of a GET, then nothing, keeping the connection open (a server hung mid-body, which only a read timeout
ends); `redirect_loop` answers every request with a 302 to the same URL; `redirect_hops` sends each request
through a chain of that many 302s before serving it (a chain a client should follow, up to its bound).

Used by the tests (`tests/data/remote/test_remote_reads.py`) and the benchmark (`benchmarks/remote_reads.py`).
"""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("503", "503-retry-after", "429", "drop", "truncate", "short", "long")


@dataclass(frozen=True)
class Faults:
    latency_s: float = 0.0  # added before every response
    bandwidth: float | None = None  # bytes per second per response; None: as fast as loopback goes
    failure_rate: float = 0.0  # fraction of requests that get one of `kinds`
    kinds: tuple[str, ...] = KINDS
    retry_after: str = "0.01"  # the Retry-After value sent with 503-retry-after, 429 and `down`
    seed: int = 0
    down: bool = False  # every request answered 503 (with `retry_after`)
    down_after: int | None = None  # the server goes down (as `down`) once it has seen this many requests
    ignore_range: bool = False  # answer ranged GETs with 200 and the whole file, as some servers do
    # answer ranged GETs with 206 and the asked length, but no Content-Range and the bytes from offset 0 (a lie
    # only the missing header gives away)
    lie_range: bool = False
    stall: str | None = None  # GETs of paths ending so send half their body, then stay silent for `stall_s`
    stall_s: float = 60.0
    redirect_loop: str | None = None  # requests of paths ending so are redirected to themselves, forever
    redirect_hops: int = 0  # every request is redirected this many times (?hop=1, ?hop=2, ...) before served
    endless: str | None = None  # paths ending so are announced at 10**12 bytes, and a GET sends zeros until closed


class FlakyServer:
    """`with FlakyServer(root, Faults(...)) as server:` serves `root` at `server.url`; `server.faults` can be
    changed while it runs (a server that goes down, then comes back)."""

    def __init__(self, root: str | os.PathLike[str], faults: Faults | None = None) -> None:
        self.root = Path(root)
        self.faults = faults or Faults()
        self.requests = 0  # every request, faults included
        self.bytes_sent = 0  # body bytes written, over all requests
        self.range_requests = 0  # ranged GETs answered in full
        self.ranges_by_file: Counter[str] = Counter()  # the same, by path
        self.injected: Counter[str] = Counter()  # faults sent, by kind
        self.connections: set[tuple[str, int]] = set()
        self.heads = 0  # HEAD requests (how many files were sized)
        self.in_flight = 0  # requests being answered now, and the most at once (a client's concurrency)
        self.max_in_flight = 0
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"flaky": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self.closing = threading.Event()  # ends the stalls when the server stops

    def __enter__(self) -> FlakyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()

    def fault_for(self, key: str) -> str | None:
        """The fault this request gets (None: none): a hash of the seed, the request and its repeat count."""
        f = self.faults
        with self._lock:
            self.requests += 1
            self._seen[key] += 1
            n = self._seen[key]
            total = self.requests
        if f.down or (f.down_after is not None and total > f.down_after):
            return "down"
        if f.failure_rate <= 0:
            return None
        h = hashlib.sha256(f"{f.seed}|{key}|{n}".encode()).digest()
        if int.from_bytes(h[:8], "little") / 2**64 >= f.failure_rate:
            return None
        return f.kinds[int.from_bytes(h[8:16], "little") % len(f.kinds)]

    def count(self, fault: str | None, ranged: bool, path: str) -> None:
        with self._lock:
            if fault is not None:
                self.injected[fault] += 1
            elif ranged:
                self.range_requests += 1
                self.ranges_by_file[path] += 1


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default backlog of 5 makes the kernel drop a burst of concurrent connects

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no error of ours
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's pool reuses connections
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall
    flaky: FlakyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        with self.flaky._lock:
            self.flaky.heads += 1
        self._counted(body=False)

    def do_GET(self) -> None:
        self._counted(body=True)

    def _counted(self, body: bool) -> None:
        server = self.flaky
        with server._lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            self._serve(body)
        finally:
            with server._lock:
                server.in_flight -= 1

    def _serve(self, body: bool) -> None:
        server, faults = self.flaky, self.flaky.faults
        with server._lock:
            server.connections.add(self.client_address)
        header = self.headers.get("Range")
        fault = server.fault_for(f"{self.command} {self.path} {header}")
        if faults.latency_s:
            time.sleep(faults.latency_s)
        name, _, query = self.path.partition("?")
        if self._redirected(name, query):
            return
        path = server.root / name.lstrip("/")
        if not path.resolve().is_relative_to(server.root.resolve()) or not path.is_file():
            self._empty(404)
            return
        if faults.endless is not None and name.endswith(faults.endless):
            self._endless(body)
            return
        size = path.stat().st_size
        status, start, end = 200, 0, size - 1
        if header and not faults.ignore_range:
            lo, _, hi = header.removeprefix("bytes=").partition("-")
            start, end = int(lo), min(int(hi or size - 1), size - 1)
            if start >= size:
                self._empty(416, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        if fault in ("short", "long") and not body:
            fault = "503"
        server.count(fault, status == 206, self.path)
        if fault in ("down", "503"):
            self._empty(503, {"Retry-After": faults.retry_after} if fault == "down" else {})
            return
        if fault in ("503-retry-after", "429"):
            self._empty(int(fault[:3]), {"Retry-After": faults.retry_after})
            return
        if fault == "drop":
            self._hang_up()
            return
        length = end - start + 1 + {"short": -1, "long": 1}.get(fault or "", 0)
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        stat = path.stat()  # as object stores do: what tells a rewritten file from the one read before
        self.send_header("ETag", f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"')
        self.send_header("Last-Modified", self.date_time_string(int(stat.st_mtime)))
        if status == 206 and faults.lie_range:
            start, end = 0, end - start
        elif status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start + 1)
        data = data[:-1] if fault == "short" else data + b"\0" if fault == "long" else data
        if fault == "truncate":
            self._send(data[: len(data) // 2], faults.bandwidth)
            self._hang_up()
            return
        if faults.stall is not None and name.endswith(faults.stall):
            server.count("stall", False, self.path)
            self._send(data[: len(data) // 2], faults.bandwidth)
            self.wfile.flush()
            server.closing.wait(faults.stall_s)  # silent, the connection open: only the client's timeout ends it
            self._hang_up()
            return
        self._send(data, faults.bandwidth)

    def _redirected(self, name: str, query: str) -> bool:
        """Answer with a 302 when a redirect fault applies to this request (True: answered)."""
        faults = self.flaky.faults
        hop = int(query.removeprefix("hop=")) if query.startswith("hop=") else 0
        if faults.redirect_loop is not None and name.endswith(faults.redirect_loop):
            location = self.path  # itself: a loop
        elif hop < faults.redirect_hops:
            location = f"{name}?hop={hop + 1}"
        else:
            return False
        self.flaky.count("redirect", False, self.path)
        self._empty(302, {"Location": location})
        return True

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _endless(self, body: bool) -> None:
        """Announce 10**12 bytes and send zeros until the client hangs up (or a minute passes)."""
        self.send_response(200)
        self.send_header("Content-Length", str(10**12))
        self.end_headers()
        began = time.monotonic()
        while body and time.monotonic() - began < 60 and not self.flaky.closing.is_set():
            try:
                self._send(bytes(1 << 16), None)
            except OSError:
                return

    def _send(self, data: bytes, bandwidth: float | None) -> None:
        with self.flaky._lock:
            self.flaky.bytes_sent += len(data)
        if bandwidth is None:
            self.wfile.write(data)
            return
        chunk = 16 * 1024
        for i in range(0, len(data), chunk):
            self.wfile.write(data[i : i + chunk])
            time.sleep(min(chunk, len(data) - i) / bandwidth)

    def _hang_up(self) -> None:
        """Close the connection at once, as a crashed or reset server would."""
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main() -> None:
    """`python -m tests.flaky_server DIR --latency 0.05 --failure-rate 0.1`: serve DIR until killed, printing the
    URL first (the benchmark runs the server in a process of its own, so it does not share the client's GIL)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("root")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes per second per response")
    ap.add_argument("--failure-rate", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    faults = Faults(latency_s=args.latency, bandwidth=args.bandwidth, failure_rate=args.failure_rate, seed=args.seed)
    with FlakyServer(args.root, faults) as server:
        print(server.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
