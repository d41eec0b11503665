"""SIGTERM (a scheduler's stop) and Ctrl-C (SIGINT) in the middle of a long command: the conventional exit status,
one line and no traceback (worker processes included), and no temporaries left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stop_mid_run(args: list[str], ready: Callable[[], bool], sig: signal.Signals) -> tuple[int, str]:
    """Run `olmo-data ARGS`, send `sig` once `ready()` says it is mid-run; (exit status, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from olmo_cli.main import main; main()", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, f"the command ended before it could be stopped: {proc.communicate()}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def assert_stopped_cleanly(status: int, err: str, sig: signal.Signals, dest: Path) -> None:
    assert status == 128 + sig, err
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines()[-1] == f"stopped by {sig.name}: nothing half-written is left; rerun to finish"
    left = [p.name for p in dest.rglob(".tmp*")] if dest.exists() else []
    assert not left, left


@pytest.mark.parametrize(("sig", "processes"), [(signal.SIGTERM, 2), (signal.SIGINT, 1)])
def test_prepare_tulu_stops_cleanly(demo_tokenizer: str, tmp_path: Path, sig: signal.Signals, processes: int) -> None:
    row = {"messages": [{"role": "user", "content": "What is this?"}, {"role": "assistant", "content": "A test."}]}
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps({**row, "id": str(i)}) + "\n" for i in range(30_000)))
    dest = tmp_path / "sft"
    args = ["prepare-tulu", "-d", str(src), "-t", demo_tokenizer, "--destination", str(dest), "--sequence-length", "64"]
    status, err = stop_mid_run(
        [*args, "--processes", str(processes)], lambda: dest.exists() and any(dest.glob(".tmp-*")), sig
    )
    assert_stopped_cleanly(status, err, sig, dest)
    assert not dest.exists()  # it made the destination: nothing of it is left


@pytest.mark.parametrize(("sig", "processes"), [(signal.SIGTERM, 2), (signal.SIGINT, 1)])
def test_tokenize_stops_cleanly_and_keeps_only_finished_inputs(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path, sig: signal.Signals, processes: int
) -> None:
    dest = tmp_path / "tokens"
    args = ["tokenize", "-d", *demo_corpus, "-t", demo_tokenizer, "--destination", str(dest), "--backend", "hf"]
    status, err = stop_mid_run(
        [*args, "--processes", str(processes), "--max-tokens-per-file", "20000"],
        lambda: dest.exists() and any(dest.glob("*part-*")),
        sig,
    )
    assert_stopped_cleanly(status, err, sig, dest)
    if dest.exists():  # inputs finished before the signal stay, recorded, for the rerun to reuse
        recorded = {int(p.stem) for p in (dest / ".progress").glob("[0-9]*.json")}
        assert recorded and {int(p.name[5:10]) for p in dest.glob("part-*")} <= recorded
        assert not (dest / "manifest.json").exists()


def test_a_signal_within_signals_deferred_is_raised_when_the_block_ends() -> None:
    """The few statements that create a temporary file and record it run together: the signal waits for them."""
    from olmo_data.interrupts import Interrupted, signals_deferred, stop_on_signals

    done = []
    with pytest.raises(Interrupted) as caught, stop_on_signals():
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run by now: had it raised, the next line would not
            done.append("inside")
        done.append("after")  # not reached: raised as the block ended
    assert done == ["inside"]
    assert caught.value.exit_code == 143
