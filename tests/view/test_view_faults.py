"""The view's fault matrix: what clients do to a server (a slow trace beside the other pages, a thousand idle
sockets, a byte a second, bodies of every kind, a flood, pages of other sites), each answered as it should be and
the view still answering the next request. Times are shortened through `Limits`; the sockets are real, on
loopback."""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

import olmo_view.answers
import olmo_view.server
from olmo_view import RunAnswers, ViewServer
from olmo_view.server import Limits
from tests.view.conftest import PASSAGE, ViewRun

FAST = Limits(idle_s=1.0, request_s=1.0, send_s=5.0, header_bytes=4096, body_bytes=1024)


@contextlib.contextmanager
def serving(view_run: ViewRun, limits: Limits = FAST, costly: int = 2) -> Iterator[ViewServer]:
    answers = RunAnswers(str(view_run.folder), costly=costly)
    answers.warm()
    server = ViewServer(answers, limits=limits)
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def connect(server: ViewServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30)


def request(server: ViewServer, path: str, method: str = "GET", headers: str = "", body: bytes = b"") -> bytes:
    port = server.server_address[1]
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}\r\n".encode() + body


def read_answer(f: Any) -> tuple[int, dict[str, str], bytes]:
    """One answer off a connection's buffered reader (status, headers lower-cased, body); (0, {}, b"") at EOF."""
    line = f.readline()
    while line.startswith(b"HTTP/1.1 100"):  # an interim answer, and its blank line
        f.readline()
        line = f.readline()
    if not line:
        return 0, {}, b""
    headers = {}
    while (h := f.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(line.split()[1]), headers, f.read(int(headers.get("content-length", 0)))


def get(server: ViewServer, path: str, headers: str = "") -> tuple[int, dict[str, str], bytes]:
    with connect(server) as s, s.makefile("rb") as f:
        s.sendall(request(server, path, headers=headers + "Connection: close\r\n"))
        return read_answer(f)


def closed_by_server(socks: list[socket.socket], within: float) -> bool:
    """The server closed every one of `socks` (EOF, or reset) within `within` seconds."""
    sel = selectors.DefaultSelector()  # select() takes no descriptor past 1024
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    deadline, open_ = time.monotonic() + within, len(socks)
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                open_ -= 1
    sel.close()
    return open_ == 0


def test_the_run_page_answers_while_a_10_s_trace_computes(view_run: ViewRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace is the library's own, made to take 10 s of CPU-bound Python (holding the GIL as a real search
    does between numpy calls); the Run page beside it is the real one, answered in well under a second."""
    real, started = olmo_view.answers.trace_spans, threading.Event()

    def slow_trace(*args: Any, **kwargs: Any) -> Any:
        started.set()
        t0 = time.monotonic()
        report = real(*args, **kwargs)
        while time.monotonic() - t0 < 10.0:
            sum(range(10_000))
        return report

    monkeypatch.setattr(olmo_view.answers, "trace_spans", slow_trace)
    with serving(view_run, Limits(), costly=1) as server:
        traced: list[Any] = []
        t0 = time.monotonic()
        worker = threading.Thread(target=lambda: traced.append(get(server, "/trace?text=" + quote(PASSAGE))))
        worker.start()
        assert started.wait(10)
        slowest = 0.0
        for path in ("/", "/", "/?page=1", f"/step/{view_run.spike_step}", "/stages", "/static/view.css", "/"):
            t = time.monotonic()
            status, _, body = get(server, path)
            slowest = max(slowest, time.monotonic() - t)
            assert status == 200, (path, body[:300])
        assert b"train/loss" in get(server, "/")[2]  # the real Run page
        status, headers, body = get(server, "/trace?text=" + quote("another text, while the first computes"))
        assert status == 503 and headers["retry-after"] == "5", body[:300]
        assert b"the view is computing as many traces as it computes at once" in body
        assert worker.is_alive(), "the trace was still computing while the pages above were answered"
        worker.join(30)
        elapsed = time.monotonic() - t0
    assert traced and traced[0][0] == 200 and b"span(s) of at least" in traced[0][2]
    assert elapsed >= 10.0 and slowest < 1.0, (elapsed, slowest)
    print(f"slowest page beside a {elapsed:.1f} s trace: {slowest * 1000:.0f} ms")


def test_a_thousand_idle_connections_then_a_request(view_run: ViewRun) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if wanted < 2100:
        pytest.skip(f"the file-descriptor limit (hard {hard}) is below the 2,100 both ends of 1,000 sockets need")
    if soft != resource.RLIM_INFINITY and soft < wanted:  # both ends of 1,000 sockets live in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        with serving(view_run, Limits(idle_s=2.0, request_s=2.0)) as server:
            idle = [connect(server) for _ in range(1000)]
            try:
                deadline = time.monotonic() + 10
                while len(server.conns) < 1000 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert len(server.conns) >= 1000  # all accepted, none answered, none closed yet
                t = time.monotonic()
                status, _, body = get(server, "/")
                took = time.monotonic() - t
                assert status == 200 and b"train/loss" in body and took < 1.0, took
                t = time.monotonic()
                assert closed_by_server(idle, 5.0)
                print(
                    f"a request beside 1,000 idle connections: {took * 1000:.0f} ms; idle ones closed after "
                    f"{time.monotonic() - t:.1f} s more"
                )
                assert len(server.conns) <= 1
            finally:
                for s in idle:
                    s.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_past_the_connection_cap_the_most_idle_go(view_run: ViewRun) -> None:
    with serving(view_run, Limits(connections=20, idle_s=30.0)) as server:
        idle = [connect(server) for _ in range(40)]
        try:
            assert get(server, "/stages")[0] == 200
            assert len(server.conns) <= 20
            assert closed_by_server(idle[:20], 2.0)  # the oldest went first
        finally:
            for s in idle:
                s.close()


def test_a_post_with_a_body_gets_one_answer_and_the_connection_goes_on(view_run: ViewRun) -> None:
    with serving(view_run) as server:
        smuggled = request(server, "/stages")  # a body that reads like a request must never be answered as one
        with connect(server) as s, s.makefile("rb") as f:
            s.sendall(request(server, "/", "POST", f"Content-Length: {len(smuggled)}\r\n", smuggled))
            status, headers, _ = read_answer(f)
            assert status == 405 and headers["allow"] == "GET, HEAD" and headers.get("connection") != "close"
            s.sendall(request(server, "/static/view.css"))
            status, headers, body = read_answer(f)
            assert status == 200 and headers["content-type"].startswith("text/css") and b"{" in body
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(1)  # nothing more: the body was not taken for a third request
        with connect(server) as s, s.makefile("rb") as f:  # the body arrives after the headers, in pieces
            s.sendall(request(server, "/", "POST", "Content-Length: 10\r\nExpect: 100-continue\r\n"))
            time.sleep(0.2)
            s.sendall(b"01234")
            time.sleep(0.2)
            s.sendall(b"56789" + request(server, "/stages", "HEAD"))  # and a request pipelined behind it
            assert read_answer(f)[0] == 405
            status, headers, body = read_answer(f)
            assert status == 200 and body == b"" and int(headers["content-length"]) > 1000
        with connect(server) as s, s.makefile("rb") as f:  # a GET with a small body: read, dropped, answered
            s.sendall(request(server, "/stages", headers="Content-Length: 3\r\n", body=b"abc") * 2)
            assert [read_answer(f)[0] for _ in range(2)] == [200, 200]


@pytest.mark.parametrize(
    ("headers", "body", "status", "said"),
    [
        ("Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n", 411, b"Chunked bodies are not read"),
        ("Content-Length: 5000\r\n", b"x" * 5000, 413, b"Request body over 1024 bytes"),
        ("Content-Length: abc\r\n", b"", 400, b"Bad Content-Length"),
        ("Content-Length: 3\r\nContent-Length: 4\r\n", b"abcd", 400, b"Bad Content-Length"),
        ("X-Long: " + "a" * 5000 + "\r\n", b"", 431, b"Request header fields too large"),
    ],
    ids=["chunked", "too-large", "bad-length", "two-lengths", "huge-headers"],
)
def test_bodies_the_view_does_not_read_are_refused_and_the_connection_closed(
    view_run: ViewRun, headers: str, body: bytes, status: int, said: bytes
) -> None:
    with serving(view_run) as server:
        with connect(server) as s, s.makefile("rb") as f:
            s.sendall(request(server, "/", "POST", headers, body))
            got, answer_headers, text = read_answer(f)
            assert got == status and said in text and answer_headers["connection"] == "close", text
            assert answer_headers["content-security-policy"] == olmo_view.server.CSP
            assert read_answer(f)[0] == 0  # closed: nothing of the body was taken for a request
        assert get(server, "/stages")[0] == 200


def test_a_client_sending_a_byte_at_a_time_is_cut_off(view_run: ViewRun) -> None:
    with serving(view_run) as server:  # request_s 1 s
        with connect(server) as slow, slow.makefile("rb") as f:
            t0 = time.monotonic()
            slow.sendall(b"GET / HTTP/1.1\r\n")
            with contextlib.suppress(OSError):
                for _ in range(20):
                    slow.sendall(b"X")
                    assert get(server, "/static/view.css")[0] == 200  # others are answered meanwhile
                    time.sleep(0.2)
            status, _, body = read_answer(f)
            assert status == 408 and b"did not arrive in time" in body
            assert time.monotonic() - t0 < 3.0
        with connect(server) as idle:  # a connection that never sends is closed after idle_s
            assert closed_by_server([idle], 3.0)


def test_a_flood_is_refused_quickly_rather_than_queued_without_bound(
    view_run: ViewRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = olmo_view.server.run_page

    def slow_page(*args: Any, **kwargs: Any) -> bytes:
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(olmo_view.server, "run_page", slow_page)
    with serving(view_run, Limits(workers=1, queue=1)) as server:
        socks = [connect(server) for _ in range(4)]
        try:
            for s in socks:
                s.sendall(request(server, "/", headers="Connection: close\r\n"))
                time.sleep(0.2)  # the worker has taken the first before the second comes
            t0 = time.monotonic()
            answers = []
            for s in socks[2:]:  # one answered by the worker, one queued, the rest refused at once
                with s.makefile("rb") as f:
                    answers.append(read_answer(f))
            assert time.monotonic() - t0 < 0.5
            assert {a[0] for a in answers} == {503} and all(a[1]["retry-after"] == "1" for a in answers)
            assert all(b"busy" in a[2] for a in answers)
            for s in socks[:2]:
                with s.makefile("rb") as f:
                    assert read_answer(f)[0] == 200
        finally:
            for s in socks:
                s.close()


def test_pages_of_other_sites_cannot_make_the_view_compute(view_run: ViewRun, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(view_run) as server:
        embedded = "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\n"
        assert get(server, "/", embedded)[0] == 403
        assert get(server, "/trace?text=abc", embedded)[0] == 403
        linked = "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\n"
        assert get(server, "/", linked)[0] == 200  # a link followed from elsewhere opens the Run page

        def never(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("traced for a page of another site")

        monkeypatch.setattr(olmo_view.answers, "trace_spans", never)
        status, _, body = get(server, "/trace?text=" + quote("some <b>text</b>"), linked)
        assert status == 200 and b"A page elsewhere sent you here to look up trace" in body
        assert b'<input type="hidden" name="text" value="some &lt;b&gt;text&lt;/b&gt;">' in body
        assert b'action="/trace"' in body and b"<b>" not in body
        with pytest.raises(AssertionError, match="traced"):
            olmo_view.answers.trace_spans()


def test_concurrent_pages_answer_as_one_at_a_time_does(view_run: ViewRun) -> None:
    """The library calls behind the pages (instance index, document index, tokenizer, kept answers) shared by the
    worker threads: the same bytes as answered one by one, whatever the interleaving."""
    paths = ["/", "/stages", *(f"/step/{n}" for n in range(1, 25)), "/document?id=passage"]
    with serving(view_run, Limits(workers=8), costly=8) as server:
        alone = {p: get(server, p)[:3:2] for p in paths}
    with serving(view_run, Limits(workers=8), costly=8) as server:  # a fresh view: nothing kept yet
        got: dict[str, list[Any]] = {p: [] for p in paths}

        def visit(k: int) -> None:
            for p in paths[k:] + paths[:k]:
                got[p].append(get(server, p)[:3:2])

        threads = [threading.Thread(target=visit, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for p in paths:
        assert len(got[p]) == 8 and all(a == alone[p] for a in got[p]), p


def test_limits_that_would_answer_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        Limits(workers=0)
    with pytest.raises(ValueError, match="times above 0"):
        Limits(idle_s=0)
