"""The program skips the interpreter's teardown after a tokenize that succeeded (`LazyGroup.__call__`), and loses
nothing by it: its output, its atexit functions and its exit status are those of a normal exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The program as its script runs it, with os._exit and an atexit function recorded in files
PROGRAM = """
import atexit, os, sys
log = sys.argv.pop(1)
real_exit = os._exit
program = os.getpid()
def recorded_exit(code):
    if os.getpid() == program:  # (worker processes end with os._exit too)
        with open(log, "a") as f:
            f.write(f"os._exit {code}\\n")
    real_exit(code)
os._exit = recorded_exit
atexit.register(lambda: os.getpid() == program and open(log, "a").write("atexit\\n"))
sys.argv[0] = "olmo-data"
from olmo_cli.main import main
main()
"""


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp_path / "log.txt"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return done, log.read_text().splitlines() if log.exists() else []


def test_a_tokenize_that_succeeds_runs_atexit_then_exits_without_teardown(tmp_path: Path, demo_tokenizer: str) -> None:
    docs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]  # two inputs on two processes: no thread left running here
    docs[0].write_text('{"id": "a", "text": "Hello, world."}\n')
    docs[1].write_text('{"id": "b", "text": "Again."}\n')
    args = ["tokenize", "-t", demo_tokenizer, "--destination", str(tmp_path / "out"), "-d", *map(str, docs)]
    done, log = run(tmp_path, *args, "--processes", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tokenized 2 documents into "), done.stdout  # printed and flushed to a pipe
    assert log == ["atexit", "os._exit 0"]  # atexit functions first, then no teardown
    assert (tmp_path / "out" / "manifest.json").is_file()
    # one input on two processes is encoded here on two threads, whose pool is still there: the usual exit joins it
    both = tmp_path / "both.jsonl"
    both.write_text(docs[0].read_text() + docs[1].read_text())
    args = ["tokenize", "-t", demo_tokenizer, "--destination", str(tmp_path / "out1"), "-d", str(both)]
    done, log = run(tmp_path, *args, "--processes", "2", "--no-progress")
    assert (done.returncode, log) == (0, ["atexit"]), done.stderr
    assert done.stdout.startswith("tokenized 2 documents into "), done.stdout
    # other commands exit the usual way (one may leave a file open, which only the teardown flushes)
    done, log = run(tmp_path, "--version")
    assert (done.returncode, done.stdout.strip(), log) == (0, f"olmo-data, version {version()}", ["atexit"])
    done, log = run(
        tmp_path, "demo-data", "--destination", str(tmp_path / "demo"), "--max-files", "20", "--vocab-size", "300"
    )
    assert (done.returncode, log) == (0, ["atexit"]), done.stderr


@pytest.mark.parametrize(
    ("args", "status"),
    [(["tokenize", "-t", "/no/such/tokenizer.json", "--destination", "x", "-d", "y.jsonl"], 2), (["no-such"], 2)],
)
def test_a_command_that_fails_exits_the_usual_way(tmp_path: Path, args: list[str], status: int) -> None:
    done, log = run(tmp_path, *args)
    assert done.returncode == status, done.stderr
    assert done.stderr.strip()
    assert log == ["atexit"]  # Python's own exit: atexit functions, no os._exit


def version() -> str:
    from olmo_data import __version__

    return __version__
