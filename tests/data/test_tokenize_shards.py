"""Tokenizing across machines: `--shard I/N` (or a Slurm array task's variables) takes inputs I, I+N, ...; shards
share one destination; the last to finish, or `--merge`, writes the manifest; the directory ends byte-identical to
a one-machine run; a failed shard re-run redoes only its own inputs. Last, scripts/slurm_tokenize.sh as a real
3-task array job on the local Slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.demo import make_demo_corpus
from olmo_data.errors import DataError
from olmo_data.tokenize import Shard, TokenizeOptions, merge_shards, tokenize
from tests.slurm_cluster import REPO, SlurmCluster, local_slurm

INPUTS = 7  # over 3 shards: shard 0 takes inputs 0, 3, 6; shard 1 takes 1, 4; shard 2 takes 2, 5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_demo_corpus(tmp_path_factory.mktemp("corpus7"), num_shards=INPUTS, max_files=42)


@pytest.fixture
def inputs(corpus: list[str], tmp_path: Path) -> list[Path]:
    """A private copy of the corpus, for tests that break and fix an input."""
    (tmp_path / "in").mkdir()
    return [Path(shutil.copy(p, tmp_path / "in")) for p in corpus]


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (the progress records too) by relative path."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def stamps(directory: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every part file: unchanged means not rewritten."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("part-*")}


def test_shards_in_any_order_make_the_directory_of_one_run(
    corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    opts = TokenizeOptions(tokenizer=demo_tokenizer)
    tokenize(corpus, tmp_path / "one", opts)
    dest = tmp_path / "sharded"
    for index, expected_inputs in ((2, 2), (0, 3)):
        s = tokenize(corpus, dest, opts, shard=Shard(index, 3))
        assert s.inputs == expected_inputs and s.inputs_pending > 0
        assert not (dest / "manifest.json").exists()
        assert "the last shard to finish (or --merge) writes manifest.json" in s.line()
    assert sorted({p.name[5:10] for p in dest.glob("part-*.npy")}) == ["00000", "00002", "00003", "00005", "00006"]
    last = tokenize(corpus, dest, opts, shard=Shard(1, 3))
    assert last.inputs == 2 and last.inputs_pending == 0 and "all shards done" in last.line()
    assert tree(dest) == tree(tmp_path / "one")


def test_shards_at_once_from_slurm_array_variables(corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    """Three processes at once, each told its shard only by Slurm's array variables (an array `--array=1-3`)."""
    dest = tmp_path / "sharded"
    command = [sys.executable, "-m", "olmo_cli.main", "tokenize", "-d", *corpus, "-t", demo_tokenizer]
    command += ["--destination", str(dest), "--no-progress"]
    array = {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "3"}
    procs = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **array, "SLURM_ARRAY_TASK_ID": str(task)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for task in (1, 2, 3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    for shard, output in enumerate(outputs):
        assert f"shard {shard}/3 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)" in output, output
    assert sum("all shards done: manifest.json written" in o for o in outputs) >= 1, outputs
    tokenize(corpus, tmp_path / "one", TokenizeOptions(tokenizer=demo_tokenizer))
    assert tree(dest) == tree(tmp_path / "one")


def test_a_failed_shard_reruns_alone_and_merge_names_what_is_missing(
    inputs: list[Path], demo_tokenizer: str, tmp_path: Path
) -> None:
    opts = TokenizeOptions(tokenizer=demo_tokenizer)
    paths = [str(p) for p in inputs]
    whole = inputs[4].read_bytes()
    inputs[4].write_bytes(whole[: len(whole) // 2])  # shard 1/3's second input, cut short
    dest = tmp_path / "out"
    tokenize(paths, dest, opts, shard=Shard(0, 3))
    with pytest.raises(DataError, match=f"{inputs[4].name}: cannot be read past line"):
        tokenize(paths, dest, opts, shard=Shard(1, 3))
    tokenize(paths, dest, opts, shard=Shard(2, 3))
    assert not (dest / "manifest.json").exists()
    # bad input: the failed shard leaves nothing of its own (input 1 too), as a one-machine run would
    missing = rf"2 of 7 inputs are not tokenized yet \(#1 {inputs[1]}, #4 {inputs[4]}\); rerun the shards"
    with pytest.raises(DataError, match=missing):
        merge_shards(paths, dest, opts)
    before = stamps(dest)

    inputs[4].write_bytes(whole)  # fixed
    rerun = tokenize(paths, dest, opts, shard=Shard(1, 3))
    assert rerun.inputs == 2 and rerun.inputs_reused == 0 and rerun.inputs_pending == 0
    assert stamps(dest).items() >= before.items(), "the other shards' parts were not rewritten"
    tokenize(paths, tmp_path / "one", opts)
    assert tree(dest) == tree(tmp_path / "one")


def test_merge_writes_the_same_manifest_and_refuses_a_destination_without_shards(
    corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    args = ["tokenize", "-d", *corpus, "-t", demo_tokenizer, "--destination", str(tmp_path / "out")]
    r = CliRunner().invoke(main, [*args, "--merge"])
    assert r.exit_code == 2 and "no tokenize run recorded there; run the shards (--shard I/N) first" in r.output
    for i in range(2):
        r = CliRunner().invoke(main, [*args, "--shard", f"{i}/2", "--no-progress"])
        assert r.exit_code == 0 and f"shard {i}/2 (" in r.output, r.output
    manifest = (tmp_path / "out" / "manifest.json").read_bytes()
    (tmp_path / "out" / "manifest.json").unlink()  # as if the last shard died before writing it
    r = CliRunner().invoke(main, [*args, "--merge"])
    assert r.exit_code == 0 and r.output.startswith("merged 7 inputs: "), r.output
    assert r.output.strip().endswith("manifest.json written"), r.output
    assert (tmp_path / "out" / "manifest.json").read_bytes() == manifest


def test_a_shard_leaves_the_temporaries_of_other_shards_alone(
    demo_tokenizer: str, corpus: list[str], tmp_path: Path
) -> None:
    """Shards write into one directory at once: a starting shard must not clear another's files in progress."""
    dest = tmp_path / "out"
    dest.mkdir()
    others = dest / ".tmp-part-00001-00000.npy"  # input 1 is shard 1/3's
    others.write_bytes(b"being written")
    tokenize(corpus, dest, TokenizeOptions(tokenizer=demo_tokenizer), shard=Shard(0, 3))
    assert others.exists()
    tokenize(corpus, dest, TokenizeOptions(tokenizer=demo_tokenizer), shard=Shard(1, 3))  # its own: stale now
    assert not others.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3/2", "shard 3/2: I must be below N, from 0 to 1"),
        ("2/2", "shard 2/2: I must be below N, from 0 to 1"),
        ("0/0", "shard 0/0: N must be at least 1"),
        ("a/3", "shard 'a/3': expected I/N"),
        ("1-3", "shard '1-3': expected I/N"),
        ("-1/2", "shard '-1/2': expected I/N"),
        ("1/", "shard '1/': expected I/N"),
    ],
)
def test_a_bad_shard_is_refused_with_the_reason(value: str, message: str) -> None:
    r = CliRunner().invoke(
        main, ["tokenize", "-d", "x.jsonl", "-t", "tok.json", "--destination", "d", "--shard", value]
    )
    assert r.exit_code == 2 and f"Invalid value for '--shard': {message}" in r.output, r.output


def test_merge_with_a_shard_is_refused() -> None:
    args = ["tokenize", "-d", "x.jsonl", "-t", "tok.json", "--destination", "d", "--shard", "0/2", "--merge"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "--merge runs once, after all shards: leave out --shard" in r.output, r.output


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3"}, "2/3"),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1"}, "2/3"),
        ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_STEP": "2"}, "error: STEP is 2"),
        ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "3"}, "error: shard 5/3: I must be below N"),
        ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "3"}, "error: are not numbers; pass --shard I/N"),
    ],
)
def test_slurm_array_variables_give_the_shard(environ: dict[str, str], expected: str | None) -> None:
    if expected is None or not expected.startswith("error: "):
        shard = Shard.from_slurm_array(environ)
        assert (None if shard is None else str(shard)) == expected
        return
    with pytest.raises(DataError, match=expected.removeprefix("error: ")):
        Shard.from_slurm_array(environ)


def test_bad_slurm_array_variables_stop_the_command(tmp_path: Path) -> None:
    env = {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_STEP": "2"}
    r = CliRunner().invoke(main, ["tokenize", "-d", "x", "-t", "t", "--destination", str(tmp_path)], env=env)
    assert r.exit_code == 2, r.output
    assert "error: SLURM_ARRAY_TASK_STEP is 2: shards need consecutive array indexes" in r.output


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.mark.slow
def test_slurm_tokenize_as_a_3_task_array_job(
    slurm: SlurmCluster, inputs: list[Path], demo_tokenizer: str, tmp_path: Path
) -> None:
    """sbatch --array=0-2 scripts/slurm_tokenize.sh: task 1 fails on a cut-short input; fixed and requeued, it
    redoes only its own inputs, and as the last to finish writes the manifest of a one-machine run."""
    whole = inputs[4].read_bytes()
    inputs[4].write_bytes(whole[: len(whole) // 2])
    dest = tmp_path / "tokens"
    job = slurm.sbatch(
        "--array=0-2",
        "--cpus-per-task=1",
        f"--output={tmp_path}/tokenize-%A_%a.out",
        str(REPO / "scripts" / "slurm_tokenize.sh"),
        *["-d", *map(str, inputs), "-t", demo_tokenizer, "--destination", str(dest)],
    )
    slurm.wait(f"{job}_0", "COMPLETED")
    slurm.wait(f"{job}_2", "COMPLETED")
    failed = slurm.wait(f"{job}_1", "FAILED")
    log = tmp_path / f"tokenize-{job}_1.out"
    assert f"{inputs[4].name}: cannot be read past line" in log.read_text(), slurm.describe(failed)
    assert not (dest / "manifest.json").exists()
    before = stamps(dest)

    inputs[4].write_bytes(whole)
    slurm.run("scontrol", "requeue", f"{job}_1")
    slurm.wait_requeued_and_release(f"{job}_1")
    done = slurm.wait(f"{job}_1", "COMPLETED")
    text = log.read_text()
    assert "shard 1/3 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)" in text, slurm.describe(done)
    assert "shard 1/3 (2 inputs): tokenized" in text and "all shards done: manifest.json written" in text, text
    assert stamps(dest).items() >= before.items(), "the other tasks' parts were not rewritten"
    tokenize([str(p) for p in inputs], tmp_path / "one", TokenizeOptions(tokenizer=demo_tokenizer))
    assert tree(dest) == tree(tmp_path / "one")
