"""`olmo-data index-documents`: an index file beside each local metadata file (found by the lookups, the same
answers), kept when current, rewritten with --force or when the metadata changed; remote metadata indexed into
the cache or a directory to upload; one-line errors and nothing half-written."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.doc_index import DocIndex, FileIndex
from olmo_data.dataset.doc_index_ranges import RangeFileIndex
from olmo_data.remote import RemoteReader
from tests.flaky_server import FlakyServer


def metadata(path: Path, n: int) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows((10 * k, 10 * k + 7, f"d{k}", "s.jsonl", k) for k in range(n))
    path.write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))


def tokens(tmp_path: Path) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    for i, n in enumerate([3, 2000]):
        (folder / f"part-{i}.npy").write_bytes(b"\0" * 8)
        metadata(folder / f"part-{i}.csv.gz", n)
    (folder / "manifest.json").write_text("{}")
    return folder


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["index-documents", *args])
    return result.exit_code, result.output


def test_indexes_beside_the_metadata_are_used_and_kept_while_current(tmp_path: Path) -> None:
    folder = tokens(tmp_path)
    code, out = run(str(folder / "*"))  # a glob's other files (manifest.json): passed over
    assert code == 0, out
    assert "2 index file(s) written, 0 current already kept" in out
    assert sorted(p.name for p in folder.glob("*.docs.idx")) == ["part-0.docs.idx", "part-1.docs.idx"]
    docs, built = DocIndex(str(tmp_path / "c1")), DocIndex(str(tmp_path / "c2"))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "m.csv.gz").write_bytes((folder / "part-1.csv.gz").read_bytes())
    assert isinstance(docs.index_for(str(folder / "part-1.npy")), RangeFileIndex)
    assert isinstance(built.index_for("other.npy", str(tmp_path / "copy" / "m.csv.gz")), FileIndex)
    for a, b in [(0, 1), (5, 12), (9999, 15003), (19990, 30000)]:
        assert docs.lookup(str(folder / "part-1.npy"), a, b) == built.lookup("other.npy", a, b)
    code, out = run(str(folder / "part-0.npy"), str(folder / "part-1.csv.gz"))
    assert code == 0 and "0 index file(s) written, 2 current already kept" in out, out
    metadata(folder / "part-0.csv.gz", 30)  # rewritten: another size
    code, out = run(str(folder / "part-0.csv.gz"), str(folder / "part-1.csv.gz"))
    assert code == 0 and "1 index file(s) written, 1 current already kept" in out, out
    code, out = run(str(folder / "part-1.csv.gz"), "--force", "--sample-every", "7")
    assert code == 0 and "1 index file(s) written" in out, out
    assert DocIndex(str(tmp_path / "c3")).index_for(str(folder / "part-1.npy")).head.sample_every == 7  # type: ignore[union-attr]


def test_remote_metadata_is_indexed_into_the_cache_or_a_directory(tmp_path: Path, fresh_reader: RemoteReader) -> None:
    tokens(tmp_path)
    with FlakyServer(tmp_path) as server:
        url = f"{server.url}/tok/part-1.csv.gz"
        code, out = run(url)
        assert code == 0, out
        assert "remote storage is only read" in out and "(remote ones: the local cache)" in out
        docs = DocIndex()
        index = docs.index_for(f"{server.url}/tok/part-1.npy")
        assert isinstance(index, RangeFileIndex) and not index.remote  # the cache's copy, a local file
        assert str(tmp_path) not in index.location and docs.built == 0
        code, out = run(f"{server.url}/tok/part-0.npy", "--out", str(tmp_path / "up"))
        assert code == 0 and (tmp_path / "up" / "part-0.docs.idx").is_file(), out
    assert not list((tmp_path / "up").glob(".tmp-*"))


def test_errors_are_one_line_and_leave_nothing(tmp_path: Path) -> None:
    folder = tokens(tmp_path)
    (folder / "bad.csv.gz").write_bytes(b"not gzip")
    code, out = run(str(folder / "bad.csv.gz"))
    assert code == 2 and out.count("\n") == 1 and "bad.csv.gz: not a metadata file" in out, out
    assert not list(folder.glob("bad*.idx")) and not list(folder.glob(".tmp-*"))
    code, out = run(str(folder / "manifest.json"))
    assert code == 2 and "neither tokenize metadata (.csv.gz) nor a token file (.npy)" in out, out
    (folder / "lone.npy").write_bytes(b"")
    code, out = run(str(folder / "lone.npy"))
    assert code == 2 and "lone.npy: a token file without metadata" in out, out
    code, out = run(str(folder / "part-0.csv.gz"), "--cache", "--out", str(tmp_path))
    assert code == 2 and "choose one" in out, out
