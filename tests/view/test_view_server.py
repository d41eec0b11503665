"""The view's server without a browser: every route answers from the run's own answers (the same as the commands'),
everything is escaped, no request path reaches the file system, nothing but GET/HEAD is answered."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from click.testing import CliRunner

from olmo_cli.main import main as olmo_data_cli
from olmo_view import CSP, RunAnswers, ViewServer
from olmo_view.markup import Html, el, href
from tests.view.conftest import PASSAGE, XSS_ID, ViewRun


@pytest.fixture(scope="module")
def server(view_run: ViewRun) -> Iterator[ViewServer]:
    answers = RunAnswers(str(view_run.folder))
    answers.warm()
    server = ViewServer(answers)
    server.start()
    yield server
    server.shutdown()
    server.server_close()


def get(
    server: ViewServer, path: str, *, method: str = "GET", host: str | None = None
) -> tuple[int, dict[str, str], str]:
    """The raw answer to `path`, sent as given (no client-side normalisation of `..`)."""
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host or f"127.0.0.1:{port}")
    conn.endheaders()
    r = conn.getresponse()
    body = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def cli_json(*args: str) -> dict:
    out = CliRunner().invoke(olmo_data_cli, list(args))
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_the_run_page_marks_the_spikes_the_command_finds(server: ViewServer, view_run: ViewRun) -> None:
    status, headers, body = get(server, "/")
    assert status == 200 and headers["content-security-policy"] == CSP
    assert headers["x-content-type-options"] == "nosniff" and "script-src 'none'" in CSP
    spikes = cli_json("spikes", str(view_run.folder), "--json")["spikes"]
    assert [s["step"] for s in spikes] == [view_run.spike_step]
    marked = re.findall(r'<a href="/step/(\d+)\?sort=excess" class="spike"', body)
    assert [int(s) for s in marked] == [view_run.spike_step]
    for key in ("train/loss", "train/z_loss", "per source", "optim/lr"):
        assert key in body
    assert "<script" not in body.lower()


def test_a_spike_opens_its_step_with_the_instances_spikes_lists(server: ViewServer, view_run: ViewRun) -> None:
    step = view_run.spike_step
    status, _, body = get(server, f"/step/{step}?sort=excess")
    assert status == 200
    listed = [c["position"] for c in cli_json("spikes", str(view_run.folder), "--json")["spikes"][0]["contributors"]]
    shown = [int(p) for p in re.findall(r'<article class="instance" id="position-\d+" data-position="(\d+)"', body)]
    assert shown[: len(listed)] == listed and sorted(listed) == sorted(view_run.noisy)
    rebuilt = cli_json("inspect-batch", view_run.config, "--step", str(step), "--json")["batch_fingerprint"]
    assert f"batch fingerprint {rebuilt}: the same as the run logged" in body
    for c in cli_json("inspect-batch", view_run.config, "--step", str(step), "--json")["instances"]:
        for d in c["documents"]:
            assert f'href="{href("/document", id=d["id"])}"'.replace("&", "&amp;") in body


def test_step_pages_are_paged_and_sorted(server: ViewServer, view_run: ViewRun) -> None:
    first = get(server, "/step/3?sort=loss&page=1")[2]
    second = get(server, "/step/3?sort=loss&page=2")[2]
    pos = [re.findall(r'data-position="(\d+)"', b) for b in (first, second)]
    assert len(pos[0]) == 8 and pos[1] == pos[0]  # the demo batch fits one page: page 2 is page 1
    report = cli_json("inspect-batch", view_run.config, "--step", "3", "--sort", "loss", "--json")
    assert [int(p) for p in pos[0]] == [i["position"] for i in report["instances"]]
    assert get(server, "/step?n=5")[:2][0] == 303


def test_untrusted_text_is_escaped_everywhere(server: ViewServer) -> None:
    status, _, body = get(server, "/document?" + f"id={quote(XSS_ID)}")
    assert status == 200
    assert "<script>alert(1)" not in body and "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "&lt;img src=x onerror=alert(1)&gt;" in body
    links = re.findall(r'href="(/step/\d+[^"#]*)#position-(\d+)" class="step-link"', body)
    assert links, "the XSS document was trained at some step"
    step_body = get(server, links[0][0].replace("&amp;", "&"))[2]
    assert f'id="position-{links[0][1]}"' in step_body  # the link's page holds the instance
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in step_body and "<script>" not in step_body
    assert "<img" not in step_body


def test_paths_outside_the_routes_are_404(server: ViewServer) -> None:
    for path in (
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/static/../../etc/passwd",
        "/static/..%2f..%2fetc%2fpasswd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/view.css/../../../etc/passwd",
        "//etc/passwd",
        "/step/../../etc/passwd",
        "/etc/passwd",
        "/static/",
        "/..%5c..%5cetc%5cpasswd",
        "/step/1%2f..%2f..%2fetc%2fpasswd",
    ):
        status, _, body = get(server, path)
        assert status == 404, path
        assert "root:" not in body
    assert get(server, "/static/view.css")[0] == 200


def test_nothing_but_reads_and_only_for_this_address(server: ViewServer) -> None:
    status, headers, _ = get(server, "/", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert get(server, "/", method="DELETE")[0] == 405
    assert get(server, "/", host="evil.example:80")[0] == 421  # a rebound name is refused
    assert get(server, "/", host=f"localhost:{server.server_address[1]}")[0] == 200
    status, headers, body = get(server, "/stages", method="HEAD")
    assert status == 200 and body == "" and int(headers["content-length"]) > 1000
    assert get(server, "/?" + "&".join(f"k{i}=1" for i in range(20)))[0] == 404


def test_bad_questions_are_answered_with_the_library_message(server: ViewServer) -> None:
    status, _, body = get(server, "/step/5000")
    assert status == 400 and "past the end of the order" in body
    assert get(server, "/step/0")[0] == 400
    assert get(server, "/document?id=no-such-doc")[0] == 400


def test_trace_spans_link_to_the_steps_trace_gives(server: ViewServer, view_run: ViewRun) -> None:
    text = "Something new. " + PASSAGE + " And an ending never seen."
    status, _, body = get(server, "/trace?" + "text=" + quote(text))
    assert status == 200
    expected = cli_json("trace", view_run.config, "--spans", text, "--json")["spans"]
    assert expected and expected[0]["steps"]
    for k, span in enumerate(expected):
        section = body[body.index(f'id="span-{k}"') :]
        section = section[: section.index("</section>")]
        assert sorted({int(s) for s in re.findall(r'href="/step/(\d+)"', section)}) == span["steps"]
    assert 'href="#span-0" class="span-mark"' in body


def test_pages_answer_within_a_second(server: ViewServer, view_run: ViewRun) -> None:
    for path in ("/", f"/step/{view_run.spike_step}", "/stages", "/trace?text=" + quote(PASSAGE), "/step/17?page=1"):
        get(server, path)  # the first visit of a step or text
        t0 = time.perf_counter()
        assert get(server, path)[0] == 200
        assert time.perf_counter() - t0 < 1.0, path
    t0 = time.perf_counter()
    assert get(server, "/step/11")[0] == 200  # a step never asked before
    assert time.perf_counter() - t0 < 1.0


def test_markup_escapes_what_it_is_given() -> None:
    assert el("p", "<b>") == "<p>&lt;b&gt;</p>"
    assert el("a", "x", href='"><script>') == '<a href="&quot;&gt;&lt;script&gt;">x</a>'
    assert el("p", Html("<b>ok</b>")) == "<p><b>ok</b></p>"
    with pytest.raises(ValueError, match="attribute name"):
        el("p", **{"on click": "x"})
    with pytest.raises(ValueError, match="the view's own routes"):
        href("//evil.example/x")
    assert href("/document", id="a&b c") == "/document?id=a%26b+c"
