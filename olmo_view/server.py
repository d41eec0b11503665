"""The view's HTTP server (the standard library's): fixed routes, the run's own answers, nothing else.

Safe by construction: a request's path is matched against a handful of fixed routes and the names of the
package's own assets (its stylesheet, read into a dict at import); no part of it ever becomes a file name, so
`/../../etc/passwd`, however encoded, is a 404. Only GET and HEAD are answered: nothing writes. Every answer carries
a Content-Security-Policy that allows no script at all and nothing from another origin, so a document holding
`<script>` could not run it even if it were not escaped (it is). Bound to 127.0.0.1 unless asked otherwise, and
then only requests naming this server as their Host are answered (a page elsewhere cannot rebind a name to it).

A page of another site open in the same browser can still send requests here (an image, a form): a browser says
so in `Sec-Fetch-Site`, and such a request is refused unless it is the user following a link (a navigation), and
even then a trace or a document's steps is not computed until the user asks for it on the view's own page. Pages
are answered concurrently by a bounded pool of threads, idle and slow clients timed out, request bodies read
under a cap or refused (`connections`); a trace computes beside the other pages, a few at most at once (`Busy`).
"""

from __future__ import annotations

import html
import ipaddress
import re
import threading
import traceback
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from olmo_view.answers import Busy, DataError, RunAnswers
from olmo_view.connections import Limits, PooledHTTPServer, PooledRequestHandler
from olmo_view.markup import el, page
from olmo_view.pages_run import run_page, step_page
from olmo_view.pages_trace import MAX_TEXT, document_page, stages_page, trace_page

__all__ = ["CSP", "COSTLY", "STATIC", "Limits", "ViewServer", "is_loopback"]

CSP = (
    "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
STATIC: dict[str, tuple[bytes, str]] = {  # the package's own assets (package data), by the route that serves each
    f"/static/{f.name}": (f.read_bytes(), _TYPES[f.name[f.name.rfind(".") :]])
    for f in resources.files("olmo_view").iterdir()
    if f.is_file() and f.name[f.name.rfind(".") :] in _TYPES
}
_STEP = re.compile(r"/step/([0-9]{1,9})")
COSTLY = {"/trace": "text", "/document": "id"}  # routes whose answer may take seconds, and what they compute for
HEADERS = {  # on every answer
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _int(values: dict[str, list[str]], key: str) -> int | None:
    value = (values.get(key) or [""])[0].strip()
    return int(value) if value.isdigit() and len(value) < 10 else None


class _Handler(PooledRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"
    server_version = "olmo-data-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.server.log:
            super().log_message(format, *args)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(head=False)

    def _refuse(self) -> None:
        self._send(
            405,
            page("Not allowed", self.server.answers.name, el("p", "This view only reads.")),
            "text/html; charset=utf-8",
            False,
            {"Allow": "GET, HEAD"},
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815

    def _answer(self, head: bool) -> None:
        status, body, kind, extra = self._route()
        self._send(status, body, kind, head, extra)

    def _route(self) -> tuple[int, bytes, str, dict[str, str]]:
        answers = self.server.answers
        html_type = "text/html; charset=utf-8"
        if not self.server.host_allowed(self.headers.get("Host", "")):
            return 421, b"this server answers requests for its own address only\n", "text/plain; charset=utf-8", {}
        url = urlsplit(self.path)
        try:
            query = parse_qs(url.query, max_num_fields=8)
        except ValueError:  # more parameters than any page takes
            return self._not_found()
        path = url.path
        if (refused := self._from_elsewhere(path, query)) is not None:
            return refused
        try:
            if path in STATIC:
                data, kind = STATIC[path]
                return 200, data, kind, {"Cache-Control": "max-age=3600"}
            if path == "/":
                return 200, run_page(answers, _int(query, "page") or 1), html_type, {}
            if path == "/step":
                n = _int(query, "n")
                if n is None:
                    return self._not_found()
                return 303, b"", "text/plain", {"Location": f"/step/{n}"}
            if m := _STEP.fullmatch(path):
                body = step_page(answers, int(m.group(1)), (query.get("sort") or [""])[0], _int(query, "page") or 1)
                return 200, body, html_type, {}
            if path == "/trace":
                text = (query.get("text") or [""])[0][:MAX_TEXT]
                return 200, trace_page(answers, text or None, _int(query, "min_tokens")), html_type, {}
            if path == "/document":
                doc_id = (query.get("id") or [""])[0].strip()
                if not doc_id or len(doc_id) > 1000:
                    return self._not_found()
                return 200, document_page(answers, doc_id, _int(query, "page") or 1), html_type, {}
            if path == "/stages":
                return 200, stages_page(answers), html_type, {}
        except Busy as e:
            body = page("Busy", answers.name, el("p", f"{e}; reload this page then.", class_="error"))
            return 503, body, html_type, {"Retry-After": str(e.retry_after)}
        except DataError as e:
            body = page("Cannot answer", answers.name, el("p", str(e), class_="error"))
            return 400, body, html_type, {}
        except Exception:  # a bug: said in the terminal, and the page says where to look
            traceback.print_exc()
            body = page("Error", answers.name, el("p", "This page failed; the terminal running the view says why."))
            return 500, body, html_type, {}
        return self._not_found()

    def _from_elsewhere(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes, str, dict[str, str]] | None:
        """A request a page of another site made (the browser's `Sec-Fetch-Site`; a browser too old to send it
        cannot be told apart): refused, unless it is a link followed, and then a costly answer waits for a click
        on the view's own page (a page elsewhere cannot make the view trace in a loop)."""
        site = self.headers.get("Sec-Fetch-Site", "none").strip().lower()
        if site in ("same-origin", "none"):
            return None
        name = self.server.answers.name
        if self.headers.get("Sec-Fetch-Mode", "").strip().lower() != "navigate":
            body = page("Refused", name, el("p", "This view answers its own pages only, not a page of another site."))
            return 403, body, "text/html; charset=utf-8", {}
        field = COSTLY.get(path)
        value = (query.get(field) or [""])[0] if field else ""
        if not value:
            return None
        ask = el(
            "form",
            el("p", f"A page elsewhere sent you here to look up {path[1:]} {value[:200]!r}."),
            [el("input", type="hidden", name=k, value=v[0][:MAX_TEXT]) for k, v in sorted(query.items())],
            el("button", "look it up"),
            action=path,
            method="get",
        )
        return 200, page("Look it up?", name, ask), "text/html; charset=utf-8", {}

    def _not_found(self) -> tuple[int, bytes, str, dict[str, str]]:
        body = page(
            "Not found", self.server.answers.name, el("p", "No such page: this view serves its own routes only.")
        )
        return 404, body, "text/html; charset=utf-8", {}

    def _send(self, status: int, body: bytes, kind: str, head: bool, extra: dict[str, str]) -> None:
        self.send_response(status)
        headers = {"Content-Type": kind, "Content-Length": str(len(body))} | HEADERS | extra
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line, say) and the connection loop's refusals (a body
        too large, a chunked one), with the same headers as every answer; the connection is closed after."""
        self.close_connection = True
        body = f"{code} {html.escape(message or '')}\n".encode()
        try:
            self._send(code, body, "text/plain; charset=utf-8", self.command == "HEAD", {"Connection": "close"})
        except (OSError, AttributeError):
            pass


class ViewServer(PooledHTTPServer):
    """Serves one run's `RunAnswers` at (host, port); port 0 takes a free one. `limits`: the bounds on clients
    (threads, queue, timeouts, sizes); the tests shorten them."""

    def __init__(
        self,
        answers: RunAnswers,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log: bool = False,
        limits: Limits | None = None,
    ) -> None:
        super().__init__((host, port), _Handler, limits or Limits(), HEADERS)
        self.answers = answers
        self.log = log

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def host_allowed(self, host_header: str) -> bool:
        """Loopback-bound: only Host headers naming a loopback address and this port (DNS rebinding)."""
        bound, port = str(self.server_address[0]), self.server_address[1]
        if not is_loopback(bound):
            return True
        host, _, given_port = host_header.rpartition(":") if not host_header.endswith("]") else (host_header, "", "")
        return given_port == str(port) and is_loopback(host.strip("[]"))

    def start(self) -> threading.Thread:
        """Serve from a thread (tests, notebooks); `shutdown()` stops it."""
        thread = threading.Thread(target=self.serve_forever, daemon=True)
        thread.start()
        return thread
