"""Reading ahead in the parent while the engine loads (`olmo_data.tokenize.reading.read_ahead`): the worker that takes
an input read ahead goes on from where the parent stopped, so the token files, counts and errors are those of a run
that did not read ahead, whichever inputs were read in full, in part or not at all.

The runs go through a fresh interpreter (`DRIVER`): the workers are forked only where no threaded runtime is loaded
(`olmo_data.processes`), which a test process that has imported torch is not, and reading ahead is done only for a
fork. The driver makes every engine look as if it were still loading, so reading ahead goes on to its budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from olmo_data.tokenize import TokenizeOptions
from olmo_data.tokenize.reading import InputReader, read_ahead
from tests.helpers import docs, write_jsonl

DRIVER = """
import json, os, sys
from olmo_data.errors import DataError
from olmo_data.tokenize import TokenizeOptions, reading, tokenize, workers
from olmo_data.tokenizer.base import Tokenizer

budget, processes, skip, dest, tok, *inputs = sys.argv[1:]
Tokenizer.loading = lambda self: True  # as if the engine were loading all along: read ahead to the budget
reading.BATCH_DOCUMENTS = 3
seen = {}

def read_ahead(*args, **kwargs):
    kwargs["budget"] = int(budget)
    readers = reading.read_ahead(*args, **kwargs)
    seen.update({r.path: [len(r.ahead), r.ended] for r in readers.values()})
    for r in readers.values():  # what was opened is read from here on: through the reader, never opened again
        os.remove(r.path)
    return readers

workers.read_ahead = read_ahead
options = TokenizeOptions(tokenizer=tok, skip_bad_documents=skip == "1", max_tokens_per_file=200)
try:
    s = tokenize(inputs, dest, options, processes=int(processes))
    out = {"counts": [s.documents, s.tokens, s.skipped_empty, s.skipped_bad]}
except DataError as e:
    out = {"error": str(e)}
print(json.dumps({**out, "read_ahead": seen}))
"""


def run(tmp_path: Path, name: str, budget: int, processes: int, skip: bool, tok: str) -> Any:
    """The driver's run on `corpus`, written afresh (the driver removes the inputs it opened to read ahead)."""
    dest, inputs = tmp_path / name, corpus(tmp_path / "in")
    argv = [str(budget), str(processes), "1" if skip else "0", str(dest), tok, *inputs]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    got = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1]), dest


def files_of(dest: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def corpus(tmp_path: Path) -> list[str]:
    """Three inputs of different sizes: gzip, plain with empty documents and bad lines, and a small one."""
    words = "the quick brown fox jumps over the lazy dog while rain falls on the plain".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(5 + i % 40)) for i in range(120)]
    a = write_jsonl(tmp_path / "a.jsonl.gz", docs(*texts))
    b_rows = docs(*(["", "   "] + texts[:50]))
    b = write_jsonl(tmp_path / "b.jsonl", b_rows, raw_lines=[b"{not json\n", b'{"id": "x", "text": 3}\n'])
    c = write_jsonl(tmp_path / "c.jsonl", docs(*texts[:7]))
    return [a, b, c]


@pytest.mark.parametrize("processes", [1, 2])
def test_token_files_are_the_same_whatever_was_read_ahead(tmp_path: Path, demo_tokenizer: str, processes: int) -> None:
    plain, plain_dest = run(tmp_path, "none", 0, processes, True, demo_tokenizer)
    assert plain["read_ahead"] == {}  # (a budget of 0: nothing read ahead, the baseline)
    expected = files_of(plain_dest)
    assert any(name.endswith(".npy") for name in expected)
    for budget in (400, 10**9):  # a few batches of the first inputs; every input whole
        got, dest = run(tmp_path, f"ahead-{budget}", budget, processes, True, demo_tokenizer)
        assert got["counts"] == plain["counts"]
        assert got["counts"][2:] == [2, 2]  # the empty documents and the bad lines, counted across the hand-over
        assert files_of(dest) == expected
        state = got["read_ahead"]
        if budget == 400:  # the continued case: an input part read, handed on to its worker unfinished
            assert any(n > 0 and not ended for n, ended in state.values()), state
        else:
            assert len(state) == 3 and all(ended for _, ended in state.values()), state


@pytest.mark.parametrize("processes", [1, 2])
def test_an_error_met_while_reading_ahead_is_raised_with_its_line(
    tmp_path: Path, demo_tokenizer: str, processes: int
) -> None:
    plain, _ = run(tmp_path, "none", 0, processes, False, demo_tokenizer)
    got, dest = run(tmp_path, "ahead", 10**9, processes, False, demo_tokenizer)
    assert "b.jsonl:53: malformed JSON" in got["error"]
    assert got["error"] == plain["error"]
    assert any(path.endswith("b.jsonl") and ended for path, (_, ended) in got["read_ahead"].items())
    assert not dest.exists()  # nothing of the failed run is left


def test_read_ahead_takes_the_first_inputs_in_turn_until_the_engine_is_loaded(tmp_path: Path) -> None:
    from olmo_data.tokenize import reading

    texts = [f"document {i} " * 20 for i in range(30)]
    paths = [write_jsonl(tmp_path / f"{name}.jsonl", docs(*texts)) for name in "abc"]
    inputs = list(enumerate(paths))
    options = TokenizeOptions(tokenizer="unused")
    calls = iter(range(6))
    readers = read_ahead(inputs, options, lambda: next(calls, None) is not None, width=2)
    try:  # six turns: a, b, a (its end), b (its end), then c in a's place, c (its end); a file is one batch
        assert sorted(readers) == [0, 1, 2]  # c joined when a ended
        assert [len(readers[i].ahead) for i in range(3)] == [1, 1, 1]
        assert all(readers[i].ended for i in range(3))
    finally:
        reading.close_all(readers)
    assert readers == {}

    one_batch = sum(len(t.strip()) for t in texts)
    readers = read_ahead(inputs, options, lambda: True, width=1, budget=one_batch + 1)
    try:  # the budget: a, then b's first batch, and no further
        assert sorted(readers) == [0, 1] and [len(readers[i].ahead) for i in (0, 1)] == [1, 1]
    finally:
        reading.close_all(readers)


def test_an_interrupt_while_reading_ahead_closes_the_files_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", docs(*(f"text {i}" for i in range(2000))))
    opened: list[InputReader] = []
    real_open = InputReader.open

    def spy(path: str, options: TokenizeOptions) -> InputReader:
        opened.append(real_open(path, options))
        return opened[-1]

    calls = iter([True, True, True])

    def loading() -> bool:
        if next(calls, None) is None:
            raise KeyboardInterrupt
        return True

    def open_on_it() -> list[str]:
        """This process's descriptors open on the input (by path: a count of all of them moves with whatever the
        garbage collector closes meanwhile)."""
        fds = "/proc/self/fd"
        targets = [os.path.realpath(os.path.join(fds, fd)) for fd in os.listdir(fds)]
        return [t for t in targets if t == os.path.realpath(path)]

    monkeypatch.setattr(InputReader, "open", staticmethod(spy))
    with pytest.raises(KeyboardInterrupt):
        read_ahead([(0, path)], TokenizeOptions(tokenizer="unused"), loading, width=1)
    assert len(opened) == 1 and len(opened[0].ahead) == 0  # read from, then dropped
    assert opened[0].rest.gi_frame is None  # type: ignore[attr-defined]  (the reader's generator closed)
    if os.path.isdir("/proc/self/fd"):
        assert open_on_it() == []  # and its file with it
