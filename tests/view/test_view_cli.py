"""`olmo-data view` as a command (serving, its messages, Ctrl-C) and the plots without a server (`view --plot`,
`spikes --plot`), with their messages for bad input and a missing matplotlib."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as olmo_data_cli
from olmo_view import RunAnswers, ViewServer
from tests.view.conftest import ViewRun

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_plots_of_the_losses_and_the_spikes(view_run: ViewRun, tmp_path: Path) -> None:
    out = CliRunner().invoke(olmo_data_cli, ["view", str(view_run.folder), "--plot", str(tmp_path / "run.png")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "run.png").read_bytes().startswith(PNG)
    args = ["spikes", view_run.config, "--json", "--plot", str(tmp_path / "spikes.png")]
    out = CliRunner().invoke(olmo_data_cli, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["spikes"][0]["step"] == view_run.spike_step  # the JSON alone on stdout
    assert (tmp_path / "spikes.png").read_bytes().startswith(PNG)


def test_bad_plots_are_named(view_run: ViewRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = str(view_run.folder)
    cases = [
        (["view", run, "--plot", str(tmp_path / "run.txt")], f"--plot {tmp_path}/run.txt: expected a file name ending"),
        (["view", run, "--plot", str(tmp_path / "no/run.png")], f"the folder {tmp_path}/no does not exist"),
        (["spikes", run, "--plot", str(tmp_path / "s.jpg")], "expected a file name ending in .png, .pdf, .svg"),
        (["view", str(tmp_path / "nope")], f"{tmp_path}/nope: not found; give a run's save folder"),
    ]
    for args, message in cases:
        out = CliRunner().invoke(olmo_data_cli, args)
        assert out.exit_code == 2 and message in out.output, (args, out.output)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the `view` extra is not installed
    out = CliRunner().invoke(olmo_data_cli, ["view", run, "--plot", str(tmp_path / "run.png")])
    assert out.exit_code == 2 and "pip install 'olmo-data[view]'" in out.output
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_the_command_serves_on_loopback_until_ctrl_c(view_run: ViewRun) -> None:
    cmd = [sys.executable, "-m", "olmo_cli.main", "view", str(view_run.folder), "--no-open"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"serving {view_run.folder} at http://127.0.0.1:") and "this machine only" in line, line
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "stages", timeout=30) as r:
            assert r.status == 200 and b"Stages and data" in r.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped" in out, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_another_address_only_when_asked_and_said(view_run: ViewRun, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ViewServer, "serve_forever", lambda self, *a, **k: None)  # answer nothing, return at once
    out = CliRunner().invoke(olmo_data_cli, ["view", str(view_run.folder), "--no-open", "--host", "0.0.0.0"])
    assert out.exit_code == 0, out.output
    assert "bound to 0.0.0.0 as asked, so anyone who can reach this machine can read the run's data" in out.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(olmo_data_cli, ["view", str(view_run.folder), "--no-open", "--port", str(port)])
    assert out.exit_code == 2 and f"--host 127.0.0.1 --port {port}: cannot serve there" in out.output


def test_a_run_still_training_is_followed(view_run: ViewRun, tmp_path: Path) -> None:
    """Steps the run logs after the view opened it appear on the next visit: curves, spikes and steps again."""
    folder = tmp_path / "run"
    shutil.copytree(view_run.folder, folder, ignore=shutil.ignore_patterns("train_data"))  # the order is read in place
    answers = RunAnswers(str(folder))
    steps, _ = answers.curves()["train/loss"]
    assert len(steps) == len(answers.metrics) and answers.spikes().spikes
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": steps[-1] + 1, "train/loss": 1.0}) + "\n")
    assert answers.curves()["train/loss"][0][-1] == steps[-1] + 1
    assert answers.spikes().steps == len(steps) + 1


def test_masked_tokens_are_shown_apart(view_run: ViewRun) -> None:
    """An instance's text is cut at its documents' edges and where the label mask turns training off."""
    answers = RunAnswers(str(view_run.folder))
    instance = next(i for i in answers.step(2).report.instances if len(i.documents or []) >= 2)
    mask = np.ones(len(instance.token_ids), dtype=bool)
    mask[:5] = False  # say, a prompt the chat template does not train
    pieces = answers.pieces(replace(instance, label_mask=mask))
    assert [p.supervised for p in pieces][:2] == [False, True]
    assert {p.document for p in pieces} >= {0, 1}
    assert "".join(p.text for p in pieces) == answers.tokenizer().decode(instance.token_ids.tolist())
    assert not any(p.supervised for p in answers.pieces(replace(instance, masked=True)))
