from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.errors import DataError
from olmo_data.sample import keep_by_hash, sample
from tests.helpers import write_jsonl


def rows(n: int, prefix: str = "d") -> list[dict[str, object]]:
    return [{"id": f"{prefix}{i}", "text": f"text {i}", "source": "s", "metadata": {"i": i}} for i in range(n)]


def ids_in(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in gzip.open(path, "rt")]


def test_fraction_depends_only_on_seed_and_id(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "in" / "a.jsonl.gz", rows(2000))
    s = sample([a], tmp_path / "out1", fraction=0.3, seed=7)
    kept = ids_in(tmp_path / "out1" / "a.jsonl.gz")
    assert kept == [f"d{i}" for i in range(2000) if keep_by_hash(f"d{i}", 7, 0.3)]
    assert 0.25 < s.documents_kept / s.documents_read < 0.35
    # the same documents in another order, split over two files: the same ones are kept
    shuffled = rows(2000)[::-1]
    b = write_jsonl(tmp_path / "in2" / "b.jsonl.gz", shuffled[:1000])
    c = write_jsonl(tmp_path / "in2" / "c.jsonl.gz", shuffled[1000:])
    sample([c, b], tmp_path / "out2", fraction=0.3, seed=7)
    again = ids_in(tmp_path / "out2" / "b.jsonl.gz") + ids_in(tmp_path / "out2" / "c.jsonl.gz")
    assert sorted(again) == sorted(kept)
    # a larger fraction keeps a superset; another seed keeps other documents
    sample([a], tmp_path / "out3", fraction=0.6, seed=7)
    assert set(kept) < set(ids_in(tmp_path / "out3" / "a.jsonl.gz"))
    sample([a], tmp_path / "out4", fraction=0.3, seed=8)
    assert set(ids_in(tmp_path / "out4" / "a.jsonl.gz")) != set(kept)


def test_kept_lines_are_copied_byte_for_byte_and_output_is_deterministic(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl.gz", rows(50))
    sample([a], tmp_path / "o1", every=10)
    sample([a], tmp_path / "o2", every=10)
    assert (tmp_path / "o1" / "a.jsonl.gz").read_bytes() == (tmp_path / "o2" / "a.jsonl.gz").read_bytes()
    original = gzip.open(a).read().splitlines(keepends=True)
    assert gzip.open(tmp_path / "o1" / "a.jsonl.gz").read().splitlines(keepends=True) == original[::10]


def test_parquet_rows_kept_with_all_columns(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [f"x{i}" for i in range(9)], "text": ["t"] * 9, "extra": list(range(9))}), path)
    sample([str(path)], tmp_path / "o", every=4)
    got = pq.read_table(tmp_path / "o" / "p.parquet").to_pydict()
    assert got["extra"] == [0, 4, 8] and got["id"] == ["x0", "x4", "x8"]


def test_bad_options_and_inputs(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "x" / "a.jsonl", rows(3), raw_lines=[b"oops\n"])
    with pytest.raises(DataError, match="exactly one of --fraction and --every"):
        sample([a], tmp_path / "o", fraction=0.5, every=2)
    with pytest.raises(DataError, match=r"--fraction must be in \(0, 1\], got 1.5"):
        sample([a], tmp_path / "o", fraction=1.5)
    with pytest.raises(DataError, match=r"a\.jsonl:4: malformed JSON"):
        sample([a], tmp_path / "o", every=1)
    assert not (tmp_path / "o" / "a.jsonl").exists()
    assert not list((tmp_path / "o").glob(".tmp-*"))
    s = sample([a], tmp_path / "o", every=1, skip_bad_documents=True)
    assert (s.documents_kept, s.skipped_bad) == (3, 1)
    b = write_jsonl(tmp_path / "y" / "a.jsonl", rows(1))
    with pytest.raises(DataError, match="have the same file name"):
        sample([a, b], tmp_path / "o2", every=1)


def test_a_bad_later_input_leaves_no_output_of_earlier_ones(tmp_path: Path) -> None:
    good = [write_jsonl(tmp_path / "in" / f"{n}.jsonl", rows(4, prefix=n)) for n in ("a", "b")]
    bad = write_jsonl(tmp_path / "in" / "c.jsonl", rows(2), raw_lines=[b"{oops\n"])
    with pytest.raises(DataError, match=r"c\.jsonl:3: malformed JSON"):
        sample([*good, bad], tmp_path / "out", every=2)
    assert not (tmp_path / "out").exists()  # not even the directory this call made


def test_cli_sample_takes_several_files_after_one_flag(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(10))
    b = write_jsonl(tmp_path / "b.jsonl", rows(5, prefix="b"))
    r = CliRunner().invoke(main, ["sample", "--documents", a, b, "--destination", str(tmp_path / "o"), "--every", "5"])
    assert r.exit_code == 0, r.output
    assert "kept 3 of 15 documents (20.00%) in 2 files" in r.output
