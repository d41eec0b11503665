from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.documents import read_documents
from olmo_data.errors import DataError
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer
from tests.conftest import shared_tokenizer
from tests.helpers import docs, write_jsonl


def test_a_worker_takes_one_thread_while_inputs_wait_then_the_cores_of_finished_workers() -> None:
    from olmo_data.tokenize.workers import _threads_now

    # [inputs not started, inputs being tokenized], and the cores (--processes)
    assert _threads_now([3, 2], 2) == 1  # every worker has an input and every core a worker
    assert _threads_now([1, 4], 4) == 1
    assert _threads_now([0, 2], 2) == 1  # the last two inputs, one a core
    assert _threads_now([0, 1], 2) == 2  # the last input alone: both cores
    assert _threads_now([0, 3], 8) == 2 and _threads_now([0, 1], 8) == 8


def read_output(dest: Path) -> list[tuple[str, str, int, list[int]]]:
    """(id, src, line, tokens) for every document in a token directory, in manifest order."""
    manifest = json.loads((dest / "manifest.json").read_text())
    out = []
    for f in manifest["files"]:
        tokens = np.memmap(dest / f["path"], dtype=manifest["dtype"], mode="r")
        assert tokens.size == f["tokens"]
        with gzip.open(dest / f["metadata"], "rt", newline="") as fh:
            rows = list(csv.reader(fh))
        assert len(rows) == f["documents"]
        for start, end, doc_id, src, loc in rows:
            out.append((doc_id, src, int(loc), tokens[int(start) : int(end)].tolist()))
    return out


def test_every_document_equals_encoding_plus_eos(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    summary = tokenize(demo_corpus, dest, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    ref = load_tokenizer(demo_tokenizer, "hf")
    expected = [
        (d.id, path, d.line, ref.encode(d.text.strip()) + [0])
        for path in demo_corpus
        for d in read_documents(path)
        if d.text.strip()
    ]
    got = read_output(dest)
    assert got == expected
    assert summary.documents == len(expected)
    assert summary.tokens == sum(len(e[3]) for e in expected)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["eos_token_id"] == 0
    assert manifest["totals"]["documents"] == len(expected)
    assert [i["path"] for i in manifest["inputs"]] == demo_corpus
    assert manifest["tokenizer"]["sha256"] == ref.sha256


@pytest.mark.parametrize("name", ["gpt2.json", "cl100k_base.json", "gpt-neox-20b.json"])
def test_real_tokenizers_match_reference_document_by_document(
    demo_corpus: list[str], tmp_path: Path, name: str
) -> None:
    """The auto backend's output (tiktoken where possible) equals HF tokenizers' encoding of every document."""
    path = shared_tokenizer(name)
    dest = tmp_path / "out"
    tokenize(demo_corpus[:1], dest, TokenizeOptions(tokenizer=path))
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(path)
    eos = hf.token_to_id("<|endoftext|>")
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["dtype"] == ("uint32" if name.startswith("cl100k") else "uint16")
    got = read_output(dest)
    texts = [d.text.strip() for d in read_documents(demo_corpus[0]) if d.text.strip()]
    assert len(got) == len(texts)
    for (doc_id, _, _, tokens), text in zip(got, texts, strict=True):
        assert tokens == hf.encode(text, add_special_tokens=False).ids + [eos], doc_id


def test_empty_documents_skipped_and_bos_eos_not_duplicated(demo_tokenizer: str, tmp_path: Path) -> None:
    tok = load_tokenizer(demo_tokenizer, "hf")
    inp = write_jsonl(tmp_path / "in.jsonl", docs("  hello world  ", "   \n\t ", "", "ends with<|endoftext|>"))
    dest = tmp_path / "out"
    s = tokenize([inp], dest, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf", bos_token_id=1))
    assert s.skipped_empty == 2 and s.documents == 2
    got = read_output(dest)
    assert [g[3] for g in got] == [
        [1] + tok.encode("hello world") + [0],
        [1] + tok.encode("ends with") + [0],  # the text's own EOS is kept, not doubled
    ]
    assert [g[2] for g in got] == [1, 4]


def test_output_is_identical_whatever_the_process_count(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    opts = TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=20_000)
    tokenize(demo_corpus, tmp_path / "p1", opts, processes=1)
    tokenize(demo_corpus, tmp_path / "p2", opts, processes=2)
    names = sorted(p.name for p in (tmp_path / "p1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "p2").iterdir())
    assert len([n for n in names if n.endswith(".npy")]) > len(demo_corpus)  # parts were split
    for name in names:
        if name != ".progress":
            assert (tmp_path / "p1" / name).read_bytes() == (tmp_path / "p2" / name).read_bytes(), name


def test_documents_never_split_and_oversized_gets_own_file(demo_tokenizer: str, tmp_path: Path) -> None:
    texts = ["short one", "x " * 400, "another short", "and one more", "y " * 10]
    inp = write_jsonl(tmp_path / "in.jsonl", docs(*texts))
    dest = tmp_path / "out"
    tokenize([inp], dest, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf", max_tokens_per_file=20))
    manifest = json.loads((dest / "manifest.json").read_text())
    got = read_output(dest)
    assert [g[0] for g in got] == [f"doc-{i}" for i in range(5)]
    assert all(f["tokens"] <= 20 or f["documents"] == 1 for f in manifest["files"])
    assert any(f["tokens"] > 20 for f in manifest["files"])
    tok = load_tokenizer(demo_tokenizer, "hf")
    assert [g[3] for g in got] == [tok.encode(t.strip()) + [0] for t in texts]


def test_id_too_large_for_dtype_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    path = shared_tokenizer("cl100k_base.json")
    inp = write_jsonl(tmp_path / "in.jsonl", docs("plain ascii", "naïve café 日本語 text"))
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=r"in\.jsonl:2: token id \d+ does not fit uint16 \(max 65535\)"):
        tokenize([inp], dest, TokenizeOptions(tokenizer=path, dtype="uint16", eos_token_id=0))
    assert not dest.exists()
    with pytest.raises(DataError, match=r"--eos-token-id 100257 does not fit uint16"):
        tokenize([inp], dest, TokenizeOptions(tokenizer=path, dtype="uint16"))


def test_bad_input_fails_with_line_and_leaves_no_output(demo_tokenizer: str, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", docs("fine"))
    bad = write_jsonl(tmp_path / "b.jsonl", docs("fine too"), raw_lines=[b"{not json}\n"])
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=r"b\.jsonl:2: malformed JSON .*--skip-bad-documents"):
        tokenize([good, bad], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    assert not dest.exists()
    s = tokenize([good, bad], dest, TokenizeOptions(tokenizer=demo_tokenizer, skip_bad_documents=True))
    assert (s.documents, s.skipped_bad) == (2, 1)
    assert "b.jsonl:2" in s.bad_examples[0]


def test_json_nested_too_deep_is_named_by_line_and_leaves_nothing(demo_tokenizer: str, tmp_path: Path) -> None:
    """json.loads recurses once per level: a line nested 100k deep was a RecursionError traceback that left the
    destination's .progress folder behind."""
    deep = b'{"id": "a", "text": "x", "m": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    bad = write_jsonl(tmp_path / "b.jsonl", docs("fine"), raw_lines=[deep])
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=r"b\.jsonl:2: JSON nested too deeply .*--skip-bad-documents"):
        tokenize([bad], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    assert not dest.exists()
    s = tokenize([bad], dest, TokenizeOptions(tokenizer=demo_tokenizer, skip_bad_documents=True))
    assert (s.documents, s.skipped_bad) == (1, 1)


def test_rerun_with_other_options_is_refused(demo_tokenizer: str, tmp_path: Path) -> None:
    inp = write_jsonl(tmp_path / "a.jsonl", docs("some text"))
    tokenize([inp], tmp_path / "out", TokenizeOptions(tokenizer=demo_tokenizer))
    again = tokenize([inp], tmp_path / "out", TokenizeOptions(tokenizer=demo_tokenizer))
    assert again.inputs_reused == 1
    with pytest.raises(DataError, match=r"out: holds tokenized output of a different run"):
        tokenize([inp], tmp_path / "out", TokenizeOptions(tokenizer=demo_tokenizer, dtype="uint32"))


def test_missing_eos_is_an_error(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.save(str(tmp_path / "t.json"))
    inp = write_jsonl(tmp_path / "a.jsonl", docs("ab"))
    with pytest.raises(DataError, match=r"t\.json: the tokenizer has no recognisable EOS token; pass --eos-token-id"):
        tokenize([inp], tmp_path / "out", TokenizeOptions(tokenizer=str(tmp_path / "t.json"), backend="hf"))


def test_killed_run_reruns_to_the_same_output(demo_tokenizer: str, tmp_path: Path) -> None:
    """SIGKILL a run part-way; the rerun reuses finished inputs and ends byte-identical to an uninterrupted run."""
    from olmo_data.demo import make_demo_corpus

    corpus = make_demo_corpus(tmp_path / "corpus", num_shards=12, max_files=240)
    code = (
        "import sys; from olmo_data.tokenize import tokenize, TokenizeOptions; "
        f"tokenize(sys.argv[1:-1], sys.argv[-1], TokenizeOptions(tokenizer={demo_tokenizer!r}, backend='hf'))"
    )
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", code, *corpus, str(killed)], cwd=Path(__file__).parents[2])
    deadline = time.time() + 60
    while not (killed / ".progress" / "00001.json").exists() and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "manifest.json").exists(), "the run finished before it could be killed"
    s = tokenize(corpus, killed, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    assert 2 <= s.inputs_reused < 12
    clean = tmp_path / "clean"
    tokenize(corpus, clean, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    assert not list(killed.glob(".tmp-*"))
    for p in clean.iterdir():
        if p.is_file():
            assert p.read_bytes() == (killed / p.name).read_bytes(), p.name


def test_cli_tokenize_prints_summary(demo_tokenizer: str, tmp_path: Path) -> None:
    inp = write_jsonl(tmp_path / "a.jsonl.gz", docs("hello there", ""))
    r = CliRunner().invoke(
        main, ["tokenize", "-d", inp, "-t", demo_tokenizer, "--destination", str(tmp_path / "o"), "--no-progress"]
    )
    assert r.exit_code == 0, r.output
    assert "tokenized 1 documents" in r.output and "skipped 1 empty and 0 bad documents" in r.output
    r = CliRunner().invoke(
        main, ["tokenize", "-d", str(tmp_path / "nope*"), "-t", demo_tokenizer, "--destination", "x"]
    )
    assert r.exit_code == 2 and "nope*: the pattern matches no file" in r.output


def test_hub_id_offline_gives_a_clear_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests: fail at once instead of retrying
    import huggingface_hub.constants  # it reads the variable once, at import: an earlier test may have imported it

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataError, match=r"some-org/some-model: could not load tokenizer from the Hugging Face hub"):
        load_tokenizer("some-org/some-model")
    with pytest.raises(DataError, match=r"missing/tokenizer\.json: tokenizer file not found"):
        load_tokenizer("missing/tokenizer.json")


def test_a_mistyped_name_without_a_reachable_hub_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: as unreachable as offline
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"gpt-neox-20: no such tokenizer file or directory here, and the Hugging Face"):
        load_tokenizer("gpt-neox-20")
    assert time.perf_counter() - start < 10  # the hub client alone retries for about 24 s


def test_fixed_input_reruns_into_an_existing_directory(demo_tokenizer: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    bad = write_jsonl(tmp_path / "a.jsonl", docs("fine"), raw_lines=[b"{broken\n"])
    with pytest.raises(DataError, match=r"a\.jsonl:2: malformed JSON"):
        tokenize([bad], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    assert dest.exists() and not list(dest.iterdir())  # the user's directory stays, empty
    write_jsonl(tmp_path / "a.jsonl", docs("fine", "fixed now"))
    s = tokenize([bad], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    assert s.documents == 2
    (dest / ".progress" / "run.json").write_text("{not json")
    with pytest.raises(DataError, match=r"run\.json: damaged .* to start over"):
        tokenize([bad], dest, TokenizeOptions(tokenizer=demo_tokenizer))


@pytest.mark.parametrize("processes", [1, 2])
def test_truncated_gzip_is_named_leaves_nothing_and_the_fixed_rerun_is_a_clean_run(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path, processes: int
) -> None:
    import shutil

    inputs = [tmp_path / "in" / Path(p).name for p in demo_corpus]
    (tmp_path / "in").mkdir()
    for src, dst in zip(demo_corpus, inputs, strict=True):
        shutil.copyfile(src, dst)
    whole = inputs[1].read_bytes()
    inputs[1].write_bytes(whole[: len(whole) // 2])  # a download cut short
    opts = TokenizeOptions(tokenizer=demo_tokenizer, backend="hf")
    dest = tmp_path / "out"
    with pytest.raises(
        DataError, match=rf"{inputs[1].name}: cannot be read past line \d+ \(EOFError.*truncated or corrupt"
    ):
        tokenize([str(p) for p in inputs], dest, opts, processes=processes)
    assert not dest.exists()
    dest.mkdir()  # a destination the user made: emptied of this call's output, progress records included
    with pytest.raises(DataError, match="truncated or corrupt"):
        tokenize([str(p) for p in inputs], dest, opts, processes=processes)
    assert sorted(p.name for p in dest.iterdir()) == []
    inputs[1].write_bytes(whole)  # fixed
    tokenize([str(p) for p in inputs], dest, opts, processes=processes)
    clean = tmp_path / "clean"
    tokenize([str(p) for p in inputs], clean, opts, processes=1)
    for part in sorted(clean.glob("part-*")) + [clean / "manifest.json"]:
        assert (dest / part.name).read_bytes() == part.read_bytes(), part.name


def test_a_fixed_input_is_redone_and_the_others_reused(demo_tokenizer: str, tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", docs("first text"))
    b = write_jsonl(tmp_path / "b.jsonl", docs("second text"))
    dest = tmp_path / "out"
    tokenize([a, b], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    write_jsonl(tmp_path / "b.jsonl", docs("second text, corrected"))
    again = tokenize([a, b], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    assert again.inputs_reused == 1 and again.documents == 2


def test_a_different_run_says_what_differs(demo_tokenizer: str, tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", docs("some text"))
    b = write_jsonl(tmp_path / "b.jsonl", docs("more text"))
    dest = tmp_path / "out"
    tokenize([a], dest, TokenizeOptions(tokenizer=demo_tokenizer))
    with pytest.raises(DataError, match=r"different run \(options max_tokens_per_file\)"):
        tokenize([a], dest, TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=100))
    with pytest.raises(DataError, match=r"different run \(inputs \(new: \[.*b\.jsonl'\]\)\)"):
        tokenize([a, b], dest, TokenizeOptions(tokenizer=demo_tokenizer))


def test_sample_of_a_truncated_gzip_leaves_no_directory(demo_corpus: list[str], tmp_path: Path) -> None:
    from olmo_data.sample import sample

    bad = tmp_path / "x.jsonl.gz"
    data = Path(demo_corpus[0]).read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(DataError, match=r"x\.jsonl\.gz: cannot be read past line \d+"):
        sample([str(bad)], tmp_path / "sampled", fraction=0.5)
    assert not (tmp_path / "sampled").exists()


@pytest.mark.parametrize("processes", [1, 2])
def test_progress_bar_counts_input_bytes_to_100_percent_and_stays(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], processes: int
) -> None:
    tokenize(demo_corpus, tmp_path / "o", TokenizeOptions(tokenizer=demo_tokenizer), processes=processes, progress=True)
    err = capsys.readouterr().err
    last = err.split("\r")[-1]  # the bar's final frame, left on screen (a cleared bar ends with an empty frame)
    total = sum(os.path.getsize(p) for p in demo_corpus)
    assert last.startswith("tokenize: 100%") and last.endswith("\n"), repr(err[-300:])
    assert f"files {len(demo_corpus)}/{len(demo_corpus)}" in last, last
    assert f"/{total / 1e6:.2f}M " in last or f"/{total / 1e3:.0f}k " in last, (last, total)


def test_read_position_follows_a_gzip_file(tmp_path: Path) -> None:
    from olmo_data.documents import ReadPosition

    # about 1.6 MB compressed: more than one block of the decompressor's read-ahead (igzip reads 512 KiB at once)
    texts = [random.Random(i).randbytes(500).hex() for i in range(3000)]
    path = write_jsonl(tmp_path / "a.jsonl.gz", docs(*texts))
    position = ReadPosition()
    seen = [position.bytes() for _ in read_documents(path, position=position)]
    assert seen[0] is not None and 0 < seen[0] < seen[-1] <= os.path.getsize(path)
    assert seen == sorted(seen)  # it only moves forward


class _FillingFile:
    """A token file on a disk that fills up after `room[0]` bytes: writes then fail with ENOSPC, and so does
    closing, as the buffered bytes cannot be written either (what made the old abort path raise again)."""

    def __init__(self, f: Any, room: list[int]) -> None:
        self.f, self.room = f, room

    def write(self, data: bytes) -> int:
        self.room[0] -= len(data)
        if self.room[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self.f.write(data))

    def close(self) -> None:
        self.f.close()
        if self.room[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("processes", [1, 2])
def test_a_full_disk_is_one_line_naming_the_folder_and_leaves_no_temporaries(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    from olmo_data.tokenize import PartWriter

    words = "the quick brown fox jumps over the lazy dog and keeps on running".split()
    inputs = [
        write_jsonl(tmp_path / f"{k}.jsonl", docs(*(" ".join(words[: 3 + i % 10]) for i in range(300))))
        for k in range(3)
    ]
    opts = TokenizeOptions(tokenizer=demo_tokenizer, backend="hf", max_tokens_per_file=400)
    opened = PartWriter._open
    room = [3000]  # bytes of input 1's token files before the disk is full (forked workers inherit the patch)

    def open_on_a_filling_disk(self: PartWriter) -> None:
        opened(self)
        if self.input_index == 1:
            self._npy = _FillingFile(self._npy, room)

    monkeypatch.setattr(PartWriter, "_open", open_on_a_filling_disk)
    monkeypatch.setattr("olmo_data.processes.THREADED_RUNTIMES", ())  # workers forked (torch loaded here or not)
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=rf"{dest}: the disk is full \(\[Errno 28\] .*\); free space there and rerun"):
        tokenize(inputs, dest, opts, processes=processes)
    left = sorted(p.name for p in dest.rglob("*")) if dest.exists() else []
    assert not [n for n in left if n.startswith(".tmp-")], left
    recorded = {int(p.stem) for p in (dest / ".progress").glob("[0-9]*.json")} if dest.exists() else set()
    assert 1 not in recorded and {int(n[5:10]) for n in left if n.startswith("part-")} <= recorded, left

    args = ["-t", demo_tokenizer, "--destination", str(dest), "--backend", "hf", "--max-tokens-per-file", "400"]
    r = CliRunner().invoke(main, ["tokenize", "-d", *inputs, *args, "--processes", str(processes)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.output.count("\n") == 1 and f"error: {dest}: the disk is full" in r.output, r.output

    monkeypatch.undo()  # space freed: the rerun finishes, byte-identical to a run that never failed
    tokenize(inputs, dest, opts, processes=processes)
    tokenize(inputs, tmp_path / "clean", opts)
    for part in sorted((tmp_path / "clean").glob("part-*")) + [tmp_path / "clean" / "manifest.json"]:
        assert (dest / part.name).read_bytes() == part.read_bytes(), part.name


def test_a_failed_input_stops_the_other_workers_promptly_and_leaves_nothing(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool is ended by asking workers to stop and waiting for them, not by killing them (a worker killed while
    it sends its result holds the result queue's lock, and `Pool.terminate` can then hang): a worker in the middle
    of a long input must notice within a batch, remove its temporaries, and exit."""
    from olmo_data.tokenize import reading, workers

    encode = workers._encode

    def slow_encode(*args: Any) -> Any:
        time.sleep(0.01)  # the long input would take 30 s to finish
        return encode(*args)

    monkeypatch.setattr(reading, "BATCH_DOCUMENTS", 1)
    monkeypatch.setattr(workers, "_encode", slow_encode)
    long = write_jsonl(tmp_path / "long.jsonl", docs(*(f"document number {i}" for i in range(3000))))
    bad = write_jsonl(tmp_path / "bad.jsonl", docs(*(f"text {i}" for i in range(100))), raw_lines=[b"{bad\n"])
    dest = tmp_path / "out"
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"bad\.jsonl:101: malformed JSON"):
        tokenize([long, bad], dest, TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=50), processes=2)
    assert time.perf_counter() - start < 20
    assert not dest.exists()
