"""The view's connections: one thread accepts them and reads each request whole; a bounded pool of threads answers.

Why not the standard library's `ThreadingHTTPServer`: it gives every connection a thread that blocks reading it for
as long as the client keeps it open, with no timeout (a few hundred idle sockets, which any page the user opens can
make, stop it), and it never reads a request's body (on a kept-alive connection a POST's body is parsed as a
second request). Here a connection costs a thread only while a complete request is being answered:

- one loop (`selectors`, no thread per connection) accepts connections and reads a request's line, headers and
  body without blocking. The whole request must arrive within `request_s` of its first byte (a client sending a
  byte at a time is cut off, 408); a connection with no request under way is closed after `idle_s`;
- a body is read under a cap and discarded (`Content-Length` up to `body_bytes`; nothing the view answers takes
  one); a larger one is refused (413), a chunked one too (411), headers past `header_bytes` (431), a malformed
  length (400), each with `Connection: close`;
- complete requests wait for one of `workers` threads in a queue of at most `queue`; past it the loop itself
  answers 503 with `Retry-After`: a flood gets a quick refusal, never unbounded threads;
- after its answer a kept-alive connection goes back to the loop (bytes already sent after the request, pipelined,
  are kept); one to close is shut for writing and drained briefly, so the client reads the answer, not a reset;
- at most `connections` open at once (and fewer than the file-descriptor limit allows): past it, the connection
  idle longest is closed to make room.
"""

from __future__ import annotations

import contextlib
import errno
import io
import queue
import re
import selectors
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

__all__ = ["Limits", "PooledHTTPServer", "PooledRequestHandler"]

_HEADER_END = re.compile(rb"\r?\n\r?\n")
_DRAIN_S = 2.0  # a connection being closed is read (and dropped) this long at most, so its answer is not reset


@dataclass(frozen=True)
class Limits:
    """The view's bounds on clients (the tests shorten the times)."""

    workers: int = 8  # threads answering requests at once
    queue: int = 32  # complete requests waiting for a thread; past it: 503
    idle_s: float = 30.0  # a connection with no request under way is closed after this
    request_s: float = 10.0  # a request's line, headers and body must all arrive within this of its first byte
    send_s: float = 30.0  # an answer must be taken by the client within this
    header_bytes: int = 16 * 1024  # request line and headers
    body_bytes: int = 64 * 1024  # a body is read and discarded up to this; larger: 413
    connections: int = 4096  # open at once (also kept under the file-descriptor limit); past it the most idle goes

    def __post_init__(self) -> None:
        if self.workers < 1 or self.queue < 0 or min(self.idle_s, self.request_s, self.send_s) <= 0:
            raise ValueError(f"{self}: at least one worker, a queue of 0 or more, and times above 0")


class _Conn:
    """A client connection as the loop sees it."""

    __slots__ = ("addr", "buf", "busy", "draining", "end", "need", "since", "sock", "started")

    def __init__(self, sock: socket.socket, addr: Any, now: float) -> None:
        self.sock, self.addr = sock, addr
        self.buf = bytearray()
        self.since = now  # when it became idle (accepted, or its last answer sent)
        self.started: float | None = None  # the first byte of the request under way; None: idle
        self.end = 0  # where the request's headers end, once found
        self.need: int | None = None  # the request's whole length (headers and body), once its headers are read
        self.draining = False  # answered and shut for writing: read until the client closes
        self.busy = False  # a worker has it

    def deadline(self, limits: Limits) -> float:
        if self.busy:
            return float("inf")
        if self.draining:
            return self.since + min(_DRAIN_S, limits.idle_s)
        if self.started is not None:
            return self.started + limits.request_s
        return self.since + limits.idle_s


class _Writer(io.RawIOBase):
    """The socket as the handler's `wfile`: every write sent whole (under the socket's timeout) or an error."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self._sock.sendall(b)
        with memoryview(b) as view:
            return view.nbytes


class PooledRequestHandler(BaseHTTPRequestHandler):
    """`BaseHTTPRequestHandler` for one request the loop has read whole (`raw`: its line and headers; the body was
    discarded); `refusal` (status, reason): answered with that instead, and the connection closed."""

    server: PooledHTTPServer  # type: ignore[assignment]  # (the loop here, not a socketserver)

    def __init__(
        self, sock: socket.socket, addr: Any, server: PooledHTTPServer, raw: bytes, refusal: tuple[int, str] | None
    ) -> None:
        self.raw, self.refusal = raw, refusal
        super().__init__(sock, addr, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self.raw)
        self.wfile = _Writer(self.request)  # type: ignore[assignment]

    def handle(self) -> None:
        self.close_connection = True  # parse_request keeps an HTTP/1.1 connection open unless asked not to
        self.handle_one_request()

    def finish(self) -> None:
        pass  # the socket belongs to the loop again

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.refusal is not None:
            self.send_error(*self.refusal)
            self.close_connection = True
            return False
        return True

    def handle_expect_100(self) -> bool:
        return True  # the loop said "100 Continue" already, when it wanted the body


class PooledHTTPServer:
    """An HTTP/1.1 server on `address` with the bounds of `limits` (see the module's docstring); `handler_class`
    answers one request at a time. `serve_forever` runs the loop (Ctrl-C stops it); `shutdown` from another thread.
    `answer_headers` go on the answers the loop itself sends (503, 408)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[PooledRequestHandler],
        limits: Limits,
        answer_headers: dict[str, str] | None = None,
    ) -> None:
        self.handler_class, self.limits = handler_class, limits
        self.answer_headers = answer_headers or {}
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=1024)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.max_connections = max(8, min(limits.connections, _descriptor_limit() - 64))
        self._queue: queue.Queue[tuple[_Conn, bytes, tuple[int, str] | None] | None] = queue.Queue()
        self._returned: list[tuple[_Conn, bool]] = []
        self._returned_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = False
        self._stopped = threading.Event()
        self._stopped.set()
        self.conns: dict[int, _Conn] = {}  # open connections by file descriptor (the loop's thread only)

    # -- running ----------------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        self._stop = False
        self._stopped.clear()
        sel = selectors.DefaultSelector()
        self.socket.setblocking(False)
        sel.register(self.socket, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        workers = [threading.Thread(target=self._work, daemon=True) for _ in range(self.limits.workers)]
        for w in workers:
            w.start()
        paused_until = 0.0  # accepting paused (out of file descriptors, nothing idle to close) until then
        sweep = 0.0  # when the connections are next checked against their deadlines (not at every event)
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= sweep:
                    for conn in [c for c in self.conns.values() if c.deadline(self.limits) <= now]:
                        self._expire(sel, conn)
                    soonest = min([c.deadline(self.limits) for c in self.conns.values()] + [now + 0.5])
                    sweep = max(soonest, now + 0.05)
                if paused_until and now >= paused_until:
                    sel.register(self.socket, selectors.EVENT_READ, "listen")
                    paused_until = 0.0
                for key, _ in sel.select(max(0.01, sweep - now)):
                    if key.data == "listen":
                        if not self._accept(sel):
                            sel.unregister(self.socket)
                            paused_until = time.monotonic() + 0.1
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        self._take_back(sel)
                    else:
                        self._read(sel, key.data)
        finally:
            with contextlib.suppress(queue.Empty):
                while True:
                    if (item := self._queue.get_nowait()) is not None:
                        self._close(sel, item[0])
            for _ in workers:
                self._queue.put(None)  # a worker answering still finishes, then stops
            for conn in list(self.conns.values()):
                self._close(sel, conn)
            sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` (running in another thread) and wait until it has."""
        self._stop = True
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the loop ---------------------------------------------------------------------------------------------

    def _accept(self, sel: selectors.BaseSelector) -> bool:
        """Accept what is waiting; False when out of file descriptors with nothing idle to close."""
        while True:
            try:
                sock, addr = self.socket.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self._close_most_idle(sel):
                        continue
                    return False
                return True  # the client gave up before it was accepted (ECONNABORTED, ...)
            if len(self.conns) >= self.max_connections and not self._close_most_idle(sel):
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, addr, time.monotonic())
            self.conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _close_most_idle(self, sel: selectors.BaseSelector) -> bool:
        idle = [c for c in self.conns.values() if not c.busy and (c.started is None or c.draining)]
        if not idle:
            return False
        self._close(sel, min(idle, key=lambda c: c.since))
        return True

    def _read(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(sel, conn)
            return
        if conn.draining:
            return  # read only to be dropped
        if conn.started is None:
            conn.started = time.monotonic()
        conn.buf += data
        self._advance(sel, conn)

    def _advance(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """Hand the connection's request to a worker once it is all in (or refuse it)."""
        limits = self.limits
        if conn.need is None:
            while conn.buf[:1] in (b"\r", b"\n"):  # blank lines before a request line are allowed (RFC 9112)
                del conn.buf[:1]
            if not conn.buf:
                conn.started = None
                return
            found = _HEADER_END.search(conn.buf, 0, limits.header_bytes + 4)
            if found is None:
                if len(conn.buf) > limits.header_bytes:
                    self._dispatch(sel, conn, 0, (431, "Request header fields too large"))
                return
            conn.end = found.end()
            head = bytes(conn.buf[: conn.end])
            length, refusal = _body_length(head, limits.body_bytes)
            if refusal is not None:
                self._dispatch(sel, conn, 0, refusal)
                return
            conn.need = conn.end + length
            if length and len(conn.buf) < conn.need and re.search(rb"(?im)^expect:\s*100-continue", head):
                with contextlib.suppress(OSError):
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(conn.buf) >= conn.need:
            self._dispatch(sel, conn, conn.need, None)

    def _dispatch(self, sel: selectors.BaseSelector, conn: _Conn, used: int, refusal: tuple[int, str] | None) -> None:
        raw = bytes(conn.buf[: conn.end]) if refusal is None else bytes(conn.buf[: _request_line_end(conn.buf)])
        del conn.buf[:used]
        conn.need = None
        sel.unregister(conn.sock)
        if self._queue.qsize() >= self.limits.queue:  # (only this thread adds: it never grows past the bound)
            self._answer_here(conn, 503, "The view is busy answering other requests; retry in a moment.", True)
            self._finish(sel, conn)
            return
        conn.busy = True
        self._queue.put((conn, raw, refusal))

    def _answer_here(self, conn: _Conn, status: int, text: str, retry: bool) -> None:
        """A short plain-text answer sent by the loop itself (best effort: it never waits on the client)."""
        body = (text + "\n").encode()
        headers = {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body))}
        headers |= self.answer_headers | {"Connection": "close"} | ({"Retry-After": "1"} if retry else {})
        reason = {408: "Request Timeout", 503: "Service Unavailable"}.get(status, "Error")
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
        with contextlib.suppress(OSError):
            conn.sock.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def _finish(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """Answered, to be closed: shut for writing, then drained until the client closes (or briefly)."""
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        conn.draining, conn.since, conn.buf = True, time.monotonic(), bytearray()
        with contextlib.suppress(ValueError, KeyError, OSError):
            sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _expire(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        if conn.started is not None and not conn.draining:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(conn.sock)
            self._answer_here(conn, 408, "The request did not arrive in time.", False)
        self._close(sel, conn)

    def _close(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        self.conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            sel.unregister(conn.sock)
        conn.sock.close()

    def _take_back(self, sel: selectors.BaseSelector) -> None:
        with self._returned_lock:
            back, self._returned = self._returned, []
        now = time.monotonic()
        for conn, keep in back:
            conn.busy = False
            if conn.sock.fileno() < 0:
                continue
            if not keep:
                self._finish(sel, conn)
                continue
            conn.sock.setblocking(False)
            conn.since, conn.started = now, (now if conn.buf else None)
            sel.register(conn.sock, selectors.EVENT_READ, conn)
            self._advance(sel, conn)  # a request already sent behind the last one

    # -- the workers ------------------------------------------------------------------------------------------

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            conn, raw, refusal = item
            keep = False
            try:
                conn.sock.settimeout(self.limits.send_s)
                handler = self.handler_class(conn.sock, conn.addr, self, raw, refusal)
                keep = not handler.close_connection
            except OSError:
                pass  # the client went away, or took too long to read its answer
            except Exception:
                traceback.print_exc(file=sys.stderr)
            with self._returned_lock:
                self._returned.append((conn, keep))
            self._wake()


def _request_line_end(buf: bytearray) -> int:
    """How much of a refused request to hand the handler: its request line (so the answer knows the method)."""
    newline = buf.find(b"\n")
    return len(buf) if newline < 0 else newline + 1


def _body_length(head: bytes, cap: int) -> tuple[int, tuple[int, str] | None]:
    """The length of the body that follows these headers, or the refusal of the request."""
    lengths: set[bytes] = set()
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return 0, (411, "Chunked bodies are not read; this view takes no request bodies")
        if name == b"content-length":
            lengths.update(v.strip() for v in value.split(b","))
    if not lengths:
        return 0, None
    if len(lengths) > 1 or not all(v.isdigit() and len(v) < 19 for v in lengths):
        return 0, (400, "Bad Content-Length")
    length = int(lengths.pop())
    if length > cap:
        return 0, (413, f"Request body over {cap} bytes; this view takes no request bodies")
    return length, None


def _descriptor_limit() -> int:
    try:
        import resource
    except ImportError:  # not POSIX
        return 1 << 16
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 16
