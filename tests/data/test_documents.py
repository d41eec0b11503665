from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from olmo_data.documents import BadDocuments, read_documents
from olmo_data.errors import DataError
from olmo_data.io import expand_patterns
from tests.helpers import docs, write_jsonl


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.json.zst", "a.ndjson"])
def test_reads_jsonl_with_any_compression(tmp_path: Path, name: str) -> None:
    path = write_jsonl(tmp_path / name, docs("first", "second"))
    got = list(read_documents(path))
    assert [(d.id, d.text, d.source, d.line) for d in got] == [
        ("doc-0", "first", "test", 1),
        ("doc-1", "second", "test", 2),
    ]


def test_reads_parquet_and_custom_fields(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"uid": [7, 8], "content": ["hello", "world"]}), path)
    got = list(read_documents(str(path), text_field="content", id_field="uid"))
    assert [(d.id, d.text, d.line) for d in got] == [("7", "hello", 1), ("8", "world", 2)]
    with pytest.raises(DataError, match=r"x\.parquet: no column 'text' \(columns: uid, content\)"):
        list(read_documents(str(path)))


def test_parquet_null_text_names_row(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["ok", None]}), path)
    with pytest.raises(DataError, match=r"x\.parquet: row 2: column 'text' is null"):
        list(read_documents(str(path)))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "x", "text": "unterminated\n', r"bad\.jsonl:2: malformed JSON"),
        (b'{"id": "x"}\n', r"bad\.jsonl:2: field 'text' is missing"),
        (b'{"id": "x", "text": 5}\n', r"bad\.jsonl:2: field 'text' is a int, not a string"),
        (b'{"id": "x", "text": "caf\xe9"}\n', r"bad\.jsonl:2: invalid UTF-8 at byte 24"),
        (b'{"id": "x", "text": "\\ud800"}\n', r"bad\.jsonl:2: field 'text' holds a lone surrogate"),
        (b"[1, 2]\n", r"bad\.jsonl:2: expected a JSON object, found list"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", docs("good"), raw_lines=[line])
    with pytest.raises(DataError, match=message):
        list(read_documents(path))
    bad = BadDocuments()
    assert [d.text for d in read_documents(path, bad=bad)] == ["good"]
    assert bad.count == 1 and "bad.jsonl:2" in bad.examples[0]


def test_blank_lines_are_not_documents_but_count_as_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [], raw_lines=[b'{"text": "a"}\n', b"\n", b'{"text": "b"}\n'])
    got = list(read_documents(path))
    assert [(d.text, d.line, d.id) for d in got] == [("a", 1, "a.jsonl:1"), ("b", 3, "a.jsonl:3")]


def test_unsupported_extension(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(DataError, match=r"a\.txt: unsupported file type"):
        list(read_documents(str(tmp_path / "a.txt")))


def test_expand_patterns(tmp_path: Path) -> None:
    for n in ("b.jsonl", "a.jsonl", "c.parquet"):
        (tmp_path / n).write_text("")
    got = expand_patterns([str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl"), str(tmp_path / "c.parquet")])
    assert [Path(p).name for p in got] == ["a.jsonl", "b.jsonl", "c.parquet"]
    with pytest.raises(DataError, match=r"nope\*\.jsonl: the pattern matches no file"):
        expand_patterns([str(tmp_path / "nope*.jsonl")])
    with pytest.raises(DataError, match=r"missing\.jsonl: file not found"):
        expand_patterns([str(tmp_path / "missing.jsonl")])
    with pytest.raises(DataError, match=r"is a directory"):
        expand_patterns([str(tmp_path)])


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_truncated_compressed_file_is_named_with_its_last_good_line(tmp_path: Path, suffix: str) -> None:
    rows = [{"id": str(i), "text": "hello world " * 50} for i in range(2000)]
    path = tmp_path / f"t{suffix}"
    write_jsonl(path, rows)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"t{re.escape(suffix)}: cannot be read past line \d+ .*truncated or corrupt"):
        list(read_documents(str(path)))
