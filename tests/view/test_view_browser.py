"""The view in a real browser: headless Chromium from the system's packages (`apt-get install chromium`, as
.ci/run does), driven by Playwright. The pages render; clicking the largest spike opens its step with the
instances `olmo-data spikes --json` lists first; a span of a pasted text opens onto the steps `olmo-data trace
--spans --json` gives; the document whose text and id hold `<script>` and `onerror=` renders them as text and runs
nothing; no request leaves 127.0.0.1; a path outside the routes is a 404. Saves a screenshot of each page into
docs/images/ (the README shows them)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from olmo_cli.main import main as olmo_data_cli
from olmo_view import RunAnswers, ViewServer
from tests.view.conftest import PASSAGE, XSS_ID, ViewRun

CHROMIUM = os.environ.get("OLMO_VIEW_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEW = Path(__file__).resolve().parents[2] / "olmo_view"


def _chromium() -> str:
    found = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip(f"no Chromium at {CHROMIUM} or on PATH: `apt-get install chromium` (as .ci/run does)")
    return found


@pytest.fixture(scope="module")
def browser_page(view_run: ViewRun) -> Iterator[tuple[Any, str, dict[str, list[str]]]]:
    executable = _chromium()
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is in the dev extra: pip install -e .[dev]"
    )
    answers = RunAnswers(str(view_run.folder))
    answers.warm()
    server = ViewServer(answers)
    server.start()
    base = server.url.rstrip("/")
    seen: dict[str, list[str]] = {"requests": [], "outside": [], "dialogs": [], "console": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1200, "height": 900})

        def route(r: Any) -> None:
            url = r.request.url
            seen["requests"].append(url)
            if url.startswith(base + "/"):
                r.continue_()
            else:  # anything else would leave the machine (or the view's own origin): refused and recorded
                seen["outside"].append(url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
        page.on("console", lambda m: seen["console"].append(m.text))
        yield page, base, seen
        context.close()
        browser.close()
    server.shutdown()
    server.server_close()


def _cli_json(*args: str) -> dict[str, Any]:
    out = CliRunner().invoke(olmo_data_cli, list(args))
    assert out.exit_code == 0, out.output
    return json.loads(out.output)  # type: ignore[no-any-return]


def _shot(page: Any, name: str, tmp: Path) -> None:
    """A screenshot of the page, always taken; written over docs/images/NAME (the README's) when that one is older
    than the view's own files, or with OLMO_VIEW_SCREENSHOTS=1: a change to the pages refreshes the pictures, and a
    test run that changed nothing leaves the repository as it was (the run's temporary paths differ each time)."""
    taken = page.screenshot(path=str(tmp / name), full_page=False)
    target = IMAGES / name
    newest = max(p.stat().st_mtime for p in VIEW.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if os.environ.get("OLMO_VIEW_SCREENSHOTS") == "1" or not target.exists() or target.stat().st_mtime < newest:
        IMAGES.mkdir(parents=True, exist_ok=True)
        target.write_bytes(taken)


def test_the_view_in_a_browser(
    browser_page: tuple[Any, str, dict[str, list[str]]], view_run: ViewRun, tmp_path: Path
) -> None:
    page, base, seen = browser_page

    # Run: curves drawn, spikes marked; the largest spike opens its step, the instances spikes lists first
    assert page.goto(base + "/").status == 200
    assert page.locator("svg.chart").count() >= 3 and page.locator("svg polyline").count() >= 4
    report = _cli_json("spikes", str(view_run.folder), "--json")
    largest = max(report["spikes"], key=lambda s: s["loss"] if s["loss"] is not None else float("inf"))
    _shot(page, "view-run.png", tmp_path)
    page.locator(f'a.spike[data-step="{largest["step"]}"]').click()
    page.wait_for_url(f"**/step/{largest['step']}?sort=excess")
    assert page.locator("h1").inner_text() == f"Step {largest['step']}"
    positions = [
        int(p) for p in page.locator("article.instance").evaluate_all("els => els.map(e => e.dataset.position)")
    ]
    listed = [c["position"] for c in largest["contributors"]]
    assert listed and positions[: len(listed)] == listed
    assert "the same as the run logged" in page.locator("p.fingerprint").inner_text()
    _shot(page, "view-step.png", tmp_path)

    # Trace: a pasted text's span links to the steps trace --spans gives
    text = "Something new. " + PASSAGE + " And an ending never seen."
    page.goto(base + "/trace")
    page.fill("textarea[name=text]", text)
    page.click("form.trace button")
    page.wait_for_selector("pre.traced")
    spans = _cli_json("trace", view_run.config, "--spans", text, "--json")["spans"]
    assert spans and page.locator("a.span-mark").count() >= 1
    _shot(page, "view-trace.png", tmp_path)
    page.locator("a.span-mark").first.click()
    assert page.url.endswith("#span-0")
    links = page.locator("#span-0 p.span-steps a.step-link").evaluate_all("els => els.map(e => +e.dataset.step)")
    assert sorted(links) == spans[0]["steps"]
    page.locator("#span-0 p.span-steps a.step-link").first.click()
    page.wait_for_url(f"**/step/{spans[0]['steps'][0]}")

    # A document whose text and id hold markup: shown as text, nothing runs
    page.goto(base + "/trace")
    page.fill("form.inline input[name=id]", XSS_ID)
    page.click("form.inline button")
    page.wait_for_selector("pre.document")
    page.wait_for_load_state("load")
    assert seen["dialogs"] == [], seen["dialogs"]  # no alert() ran
    assert "<script>alert(1)</script>" in page.locator("pre.document").inner_text()
    assert "<img src=x onerror=alert(1)>" in page.locator("h1").inner_text()
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
    _shot(page, "view-document.png", tmp_path)
    page.locator("a.step-link").first.click()
    page.wait_for_selector("article.instance")
    assert "<img src=x onerror=alert(1)>" in page.locator("main").inner_text()
    assert page.locator("img").count() == 0

    # Stages and data
    page.goto(base + "/stages")
    assert page.locator("table.stages tr").count() >= 2 and page.locator("svg.bars").count() == 2
    _shot(page, "view-stages.png", tmp_path)

    for path in ("/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/static/..%2f..%2fetc%2fpasswd"):
        response = page.goto(base + path)
        assert response.status == 404, path
        assert "root:" not in page.content()

    assert seen["dialogs"] == [], seen["dialogs"]
    assert seen["outside"] == [], seen["outside"]
    assert all(u.startswith(base + "/") for u in seen["requests"]) and len(seen["requests"]) > 10
