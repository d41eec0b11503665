"""The suffix index's fault matrix (issue 41): index files of the right size but other bytes, a token file rewritten
in place with its mtime set back, a huge manifest or shard record, a full disk. Each runs the real command
(`olmo-data trace --tokens`, `olmo-data index`) and must end in one line naming the file, exit 2, no traceback and
nothing half-written; the index's own full check (`index --verify`) says what it checked."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner, Result

from olmo_cli.main import main
from olmo_data.suffix_index.layout import SAMPLE_BLOCKS, SAMPLE_BYTES, index_folder, shard_file
from tests.cli.test_full_disk import fill_on_write, leftovers
from tests.data.suffix_index.test_suffix_index import make_files
from tests.helpers import small_disk

SHARD = ["--shard-tokens", "1000", "--context", "8", "--no-progress"]


def one_line(result: Result, *fragments: str) -> str:
    out = result.output
    assert result.exit_code == 2 and "Traceback" not in out, out
    assert out.count("\n") == 1 and out.startswith("error: "), out
    for fragment in fragments:
        assert fragment in out, out
    return out


def built(tmp_path: Path, n: int = 3000) -> tuple[list[str], Path, Path]:
    """Two uint16 token files of `n` tokens, their index (shards of 1000), the config and one file's index folder."""
    paths, cfg = make_files(tmp_path, "uint16", n=n)
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(main, ["index", str(config), *SHARD])
    assert result.exit_code == 0, result.output
    return paths, config, index_folder(paths[0])


def trace(config: Path, seq: str = "0,7,14") -> Result:
    return CliRunner().invoke(main, ["trace", str(config), "--tokens", seq])


def zeroed(data: bytes, _: Path) -> bytes:
    return bytes(len(data))


def all_ff(data: bytes, _: Path) -> bytes:
    return b"\xff" * len(data)


def shuffled(data: bytes, _: Path) -> bytes:
    values = np.frombuffer(data, dtype="<u4").copy()
    np.random.default_rng(0).shuffle(values)
    return values.tobytes()


def past_the_end(data: bytes, _: Path) -> bytes:
    return (np.frombuffer(data, dtype="<u4") + 1000).astype("<u4").tobytes()  # each one shard further on


def other_shard(_: bytes, path: Path) -> bytes:
    return path.with_name(path.name.replace("00001", "00000")).read_bytes()  # shard 0's, of the same size


def one_block(data: bytes, _: Path) -> bytes:
    """Two positions of the shard swapped: still in range, every other byte the same."""
    values = np.frombuffer(data, dtype="<u4").copy()
    values[[10, 11]] = values[[11, 10]]
    return values.tobytes()


DAMAGE: dict[str, tuple[str, Callable[[bytes, Path], bytes], str]] = {
    "positions zeroed": ("u32", zeroed, "differ from what its build wrote"),
    "positions 0xFF": ("u32", all_ff, "differ from what its build wrote"),
    "positions shuffled": ("u32", shuffled, "differ from what its build wrote"),
    "positions of another shard": ("u32", other_shard, "differ from what its build wrote"),
    "positions past the end": ("u32", past_the_end, "differ from what its build wrote"),
    "keys zeroed": ("keys", zeroed, "differ from what its build wrote"),
    "keys of another shard": ("keys", other_shard, "differ from what its build wrote"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_index_files_of_the_right_size_are_refused_by_name(tmp_path: Path, case: str) -> None:
    paths, config, folder = built(tmp_path)
    suffix, damage, says = DAMAGE[case]
    target = shard_file(folder, 1, suffix)
    good = target.read_bytes()
    target.write_bytes(damage(good, target))
    assert target.stat().st_size == len(good)
    one_line(trace(config), str(target), says, "rerun `olmo-data index CONFIG`")
    one_line(CliRunner().invoke(main, ["index", str(config), "--verify"]), str(target))
    again = CliRunner().invoke(main, ["index", str(config), *SHARD])  # the rerun the message asks for mends it
    assert again.exit_code == 0 and "sorted 1 " in again.output, again.output
    assert target.read_bytes() == good
    assert trace(config).exit_code == 0


@pytest.mark.parametrize("case", ["positions zeroed", "positions shuffled", "positions past the end", "keys zeroed"])
def test_the_structural_checks_catch_damage_whose_checksums_were_forged(tmp_path: Path, case: str) -> None:
    """The record rewritten to vouch for the damaged file (its checksums recomputed): the sampled order, range
    and key checks still refuse it, naming the file."""
    from olmo_data.suffix_index.integrity import file_record

    _, config, folder = built(tmp_path)
    suffix, damage, _ = DAMAGE[case]
    target = shard_file(folder, 1, suffix)
    target.write_bytes(damage(target.read_bytes(), target))
    record_path = shard_file(folder, 1, "json")
    record = json.loads(record_path.read_text())
    name = "positions" if suffix == "u32" else "keys"
    record[name] = file_record(np.frombuffer(target.read_bytes(), dtype=np.uint8))
    record_path.write_text(json.dumps(record))
    says = {
        "positions zeroed": "are not in sorted order of",
        "positions shuffled": "are not in sorted order of",
        "positions past the end": "past its shard's 1,000 positions",
        "keys zeroed": "is not the first 8 tokens of the suffix at rank",
    }[case]
    one_line(trace(config), str(target), says)


def test_verify_checks_every_suffix_and_says_what_it_checked(tmp_path: Path) -> None:
    _, config, folder = built(tmp_path)
    ok = CliRunner().invoke(main, ["index", str(config), "--verify"])
    assert ok.exit_code == 0, ok.output
    assert "verified the suffix index of 2 token file(s), 6,000 tokens in 6 shard(s)" in ok.output
    assert "every suffix inside its shard and in sorted order, every key" in ok.output
    target = shard_file(folder, 2, "u32")
    target.write_bytes(one_block(target.read_bytes(), target))
    verify = CliRunner().invoke(main, ["index", str(config), "--verify"])
    one_line(verify, str(target), "differ from what its build wrote")
    # the order check alone (its checksums forged) finds the two swapped positions, at their ranks
    from olmo_data.suffix_index.integrity import file_record

    record_path = shard_file(folder, 2, "json")
    record = json.loads(record_path.read_text())
    record["positions"] = file_record(np.frombuffer(target.read_bytes(), dtype=np.uint8))
    record_path.write_text(json.dumps(record))
    verify = CliRunner().invoke(main, ["index", str(config), "--verify"])
    one_line(verify, str(target), "the suffixes at ranks 10 and 11", "are not in sorted order")


def test_a_token_file_rewritten_in_place_with_its_mtime_set_back_is_refused(tmp_path: Path) -> None:
    """`cp -p`, `rsync -t`, `tar x`: same size, same mtime, the change outside the 16 sampled 4 KiB blocks. Its
    change time (ctime) gives it away; a rerun of index checks its content and sorts only the shard it changed."""
    n = 40_000  # 80 KB: the stamp samples 16 blocks of it, not all
    paths, config, folder = built(tmp_path, n=n)
    path = Path(paths[0])
    step = (path.stat().st_size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)
    at = (step + SAMPLE_BYTES + 64) // 2  # a token between the second and third sampled blocks
    assert step + SAMPLE_BYTES < 2 * at < 2 * step
    before = path.stat()
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[at] = 3  # a value make_files never writes
    copy = tmp_path / "rewritten.npy"
    tokens.tofile(copy)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    shutil.copy2(copy, path)  # cp -p: content and times
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns) != (0, after.st_ctime_ns)
    one_line(trace(config, "3"), str(path), "built for another version of", "its change time (ctime")
    again = CliRunner().invoke(main, ["index", str(config), *SHARD])
    assert again.exit_code == 0 and "sorted 1 (1,000 tokens)" in again.output, again.output
    found = trace(config, "3")
    assert found.exit_code == 0 and f" at [{at}, {at + 1}) of token file 0" in found.output, found.output


@pytest.mark.parametrize("name", ["manifest.json", "shard-00001.json"])
def test_a_huge_manifest_or_shard_record_is_refused_by_name_unread(tmp_path: Path, name: str) -> None:
    _, config, folder = built(tmp_path)
    huge = folder / name
    with open(huge, "wb") as f:  # 1.5 GB, sparse: reading it whole would take 1.5 GB of memory
        f.truncate(1_500_000_000)
    one_line(trace(config), str(huge), "over 1,048,576 bytes, not a suffix index's record")
    again = CliRunner().invoke(main, ["index", str(config), *SHARD])  # the build starts that part over
    assert again.exit_code == 0 and "Traceback" not in again.output, again.output
    assert huge.stat().st_size < 1 << 20 and trace(config).exit_code == 0


@pytest.mark.parametrize("processes", ["1", "2"])
def test_index_into_a_full_disk_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: str) -> None:
    paths, cfg = make_files(tmp_path, "uint16", n=6000)
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    args = ["index", str(config), "--shard-tokens", "6000", "-p", processes, "--no-progress"]
    with small_disk(tmp_path / "disk", "16k") as real:
        out = tmp_path / "disk" / "index"
        if not real:
            if processes == "2":
                pytest.skip("the injected full disk reaches no worker process")
            fill_on_write(monkeypatch, 20_000)
        result = CliRunner().invoke(main, [*args, "--index-dir", str(out)])
        one_line(result, f"{out}: the disk is full", "free space there and rerun")
        assert leftovers(tmp_path / "disk") == [] and not list(out.glob("*/manifest.json"))
    monkeypatch.undo()
    done = CliRunner().invoke(main, [*args, "--index-dir", str(tmp_path / "index")])
    assert done.exit_code == 0, done.output
