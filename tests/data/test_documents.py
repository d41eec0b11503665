from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_truncated_compressed_file_is_named_with_its_last_good_line(
    tmp_path: Path, suffix: str, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import olmo_data.documents as documents

    monkeypatch.setattr(documents, "FAST_READING", fast)
    rows = [{"id": str(i), "text": "hello world " * 50} for i in range(2000)]
    path = tmp_path / f"t{suffix}"
    write_jsonl(path, rows)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"t{re.escape(suffix)}: cannot be read past line \d+ .*truncated or corrupt"):
        list(read_documents(str(path)))


def test_a_damaged_gz_file_names_the_same_last_good_line_with_the_line_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path reads igzip's lines through a 1 MiB buffer, whose last fill is lost when the file fails: the
    error still names the last good line as near as the standard library's gzip does (igzip's own read-ahead is
    8 KiB, ~40 of these lines), not ~4,500 lines before it."""
    import gzip
    import random

    import olmo_data.documents as documents

    pytest.importorskip("isal.igzip")
    rows = [{"id": str(i), "text": random.Random(i).randbytes(100).hex()} for i in range(12_000)]
    path = tmp_path / "t.jsonl.gz"
    write_jsonl(path, rows)
    data = path.read_bytes()
    for damaged in (data[: len(data) // 2], data[:-6] + bytes([data[-6] ^ 0xFF]) + data[-5:]):  # cut; bad CRC
        path.write_bytes(damaged)
        named = {}
        for fast in (True, False):
            monkeypatch.setattr(documents, "FAST_READING", fast)
            with pytest.raises(DataError, match=r"cannot be read past line (\d+) ") as e:
                list(read_documents(str(path)))
            named[fast] = int(re.search(r"past line (\d+) ", str(e.value)).group(1))  # type: ignore[union-attr]
        whole = len(gzip.decompress(data).splitlines())
        assert 0 < named[True] <= named[False] <= whole and named[False] - named[True] <= 100, (named, whole)


# Lines where a JSON parser other than the standard library's could differ from it: each is read with the `fast`
# extra's readers (msgspec, isal) and without them, and must give the same documents, errors and skipped counts.
TRICKY_LINES = [
    b'{"id": "a", "text": "plain", "source": "s"}',
    b'{"text": "no id or source"}',
    b'{"id": 7, "text": "int id", "source": null}',
    b'{"id": true, "text": "bool id", "source": 3}',
    b'{"id": 1.5, "text": "float id"}',
    b'{"id": 1e2, "text": "exponent id"}',
    b'{"id": 123456789012345678901234567890, "text": "huge int id"}',
    b'{"id": -9223372036854775809, "text": "just below int64"}',
    b'{"id": 18446744073709551615, "text": "largest uint64"}',
    b'{"id": [1.5, {"k": 1, "k": 2}], "text": "container id"}',
    b'{"id": NaN, "text": "nan id"}',
    b'{"id": 1E400, "text": "infinite id"}',
    b'{"text": "first", "text": "duplicate key: the last wins"}',
    b'{"text": "\\ud83d\\ude00 a surrogate pair, escaped"}',
    b'{"text": "\\ud800 lone surrogate"}',
    b'{"text": "ok", "meta": "\\udc00 lone surrogate elsewhere"}',
    b'{"text": "ok", "meta": "\xff invalid UTF-8 elsewhere"}',
    b'{"text": "ok", "\xed\xa0\x80": "an encoded surrogate in a key"}',
    b'{"text": "caf\xc3\xa9 \xe2\x80\xa8 \xef\xbf\xbe non-ASCII"}',
    b'{"text": "caf\xe9 invalid UTF-8"}',
    b'\xef\xbb\xbf{"text": "a BOM"}',
    b'{"text": "raw\ttab"}',
    b'{"text": "escapes \\u0000 \\/ \\" \\\\ \\t"}',
    b'{"text": "ok", "meta": {"deep": ' + b"[" * 3000 + b"]" * 3000 + b"}}",
    b'{"text": "ok", "meta": NaN, "more": 1E400}',
    b'{"text": "trailing comma",}',
    b'{"text": "trailing garbage"} x',
    b'  {"text": "spaces around"}  \t\r',
    b'{"text": 5}',
    b'{"text": null}',
    b'{"id": "no text"}',
    b'["not", "an object"]',
    b'"a string"',
    b"\x0c",
    b" \t ",
    b"",
]


def _read_both_ways(path: str, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> list[Any]:
    import olmo_data.documents as documents

    out = []
    for fast in (True, False):
        monkeypatch.setattr(documents, "FAST_READING", fast)
        bad = BadDocuments()
        got = [(d.id, d.text, d.source, d.line, d.raw) for d in read_documents(path, bad=bad, **kwargs)]
        out.append((got, bad.count, bad.examples))
    return out


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_fast_readers_give_the_standard_documents_and_errors(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import olmo_data.documents as documents

    path = write_jsonl(tmp_path / name, [], raw_lines=[line + b"\n" for line in TRICKY_LINES * 2])
    fast, standard = _read_both_ways(path, monkeypatch, keep_raw=True)
    assert fast == standard
    assert (len(standard[0]), standard[1]) == (2 * 19, 2 * 14)  # (so that both kinds are there to compare)
    assert ("123456789012345678901234567890", "huge int id") in {d[:2] for d in standard[0]}
    other_fields = _read_both_ways(path, monkeypatch, text_field="id", id_field="text")
    assert other_fields[0] == other_fields[1]
    for line in TRICKY_LINES:  # each bad line alone: the same error
        one = write_jsonl(tmp_path / f"one-{name}", [], raw_lines=[line])
        errors: list[Any] = []
        for on in (True, False):
            monkeypatch.setattr(documents, "FAST_READING", on)
            try:
                errors.append([d.text for d in read_documents(one)])
            except DataError as e:
                errors.append(str(e))
        assert errors[0] == errors[1], line


def test_fast_readers_are_used_where_installed(tmp_path: Path) -> None:
    """Not a vacuous comparison above: with the `fast` extra, a good line takes msgspec and a .gz file isal."""
    from olmo_data.documents import _fast_document, _fast_fields, _open_jsonl

    msgspec = pytest.importorskip("msgspec")
    isal = pytest.importorskip("isal.igzip")
    fields = _fast_fields("text", "id")
    assert fields is not None and isinstance(fields.decode(b'{"text": "x"}'), msgspec.Struct)
    assert _fast_document(fields, b'{"id": "a", "text": "x", "meta": {"m": [1.5]}}') == ("x", "a", "")
    # msgspec refuses a lone surrogate escape in the fields it builds (the fast path relies on it, see there)
    assert _fast_document(fields, b'{"id": "a", "text": "\\ud800"}') is None
    assert _fast_fields("text", "source") is None  # names that coincide: the standard path
    path = write_jsonl(tmp_path / "a.jsonl.gz", docs("x"))
    with _open_jsonl(path) as f:  # (its lines through a larger buffer than igzip's own)
        assert isinstance(f, io.BufferedReader) and isinstance(f.raw, isal.IGzipFile)


def test_without_the_fast_extra_the_standard_readers_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from olmo_data.documents import _fast_fields, _igzip

    path = write_jsonl(tmp_path / "a.jsonl.gz", docs("first", "second"))
    expected = [(d.id, d.text, d.line) for d in read_documents(path)]
    monkeypatch.setitem(sys.modules, "msgspec", None)  # `import msgspec` raises ImportError, as when absent
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "isal.igzip", None)
    _fast_fields.cache_clear()
    _igzip.cache_clear()
    try:
        assert _fast_fields("text", "id") is None and _igzip() is None
        assert [(d.id, d.text, d.line) for d in read_documents(path)] == expected
    finally:
        _fast_fields.cache_clear()
        _igzip.cache_clear()


@pytest.mark.parametrize("limit", [1_000, 20_000])
def test_the_too_deep_verdict_does_not_depend_on_the_recursion_limit(
    tmp_path: Path, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line 513 levels deep is refused and one 512 deep read, under the default recursion limit and a raised one
    (json.loads and msgspec each recurse per level: their own verdict would move with the limit); brackets inside
    strings, however many, are not nesting."""
    import sys

    import olmo_data.documents as documents

    lines = [
        b'{"text": "deep", "m": ' + b"[" * 512 + b"]" * 512 + b"}",
        b'{"text": "512", "m": ' + b"[" * 511 + b"]" * 511 + b"}",  # (the object itself is a level)
        b'{"text": "' + b"[{" * 5_000 + b'\\"]", "m": [{"x": "]]]"}]}',
    ]
    path = write_jsonl(tmp_path / "d.jsonl", [], raw_lines=[line + b"\n" for line in lines])
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        for fast in (True, False):
            monkeypatch.setattr(documents, "FAST_READING", fast)
            bad = BadDocuments()
            got = [d.line for d in read_documents(path, bad=bad)]
            assert (got, bad.count) == ([2, 3], 1), (fast, limit)
            assert bad.examples == [f"{path}:1: {documents.TOO_DEEP}"]
    finally:
        sys.setrecursionlimit(old)
    assert documents.too_deep(lines[0]) and not documents.too_deep(lines[1]) and not documents.too_deep(lines[2])


def test_nesting_depth_equals_the_parsed_depth() -> None:
    """Random JSON (strings full of quotes, backslashes and brackets; keys too) against the depth of what
    json.loads builds."""
    import json
    import random

    from olmo_data.documents import nesting_depth

    def depth(x: Any) -> int:
        if isinstance(x, list):
            return 1 + max(map(depth, x), default=0)
        if isinstance(x, dict):
            return 1 + max(map(depth, x.values()), default=0)
        return 0

    rng = random.Random(5)

    def make(level: int) -> Any:
        r = rng.random()
        if level > 6 or r < 0.3:
            return "".join(rng.choice('[]{}"\\\\ab\n') for _ in range(rng.randrange(8)))
        if r < 0.65:
            return [make(level + 1) for _ in range(rng.randrange(4))]
        return {make(9): make(level + 1) for _ in range(rng.randrange(4))}

    for _ in range(2_000):
        value = make(0)
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        assert nesting_depth(raw) == depth(value), raw


def test_the_depth_check_cleared_by_the_text_field_agrees_with_the_measured_depth() -> None:
    """too_deep given the line's parsed text (the reader's shortcut: brackets in the text are inside a string) says
    what nesting_depth says, on lines with more than MAX_DEPTH brackets: nested just over and under the limit, the
    text full of brackets, some of them written as `\\u005b`-style escapes (which the shortcut must not trust),
    brackets in keys and other strings too."""
    import json
    import random

    from olmo_data.documents import MAX_DEPTH, bracket_count, nesting_depth, too_deep

    rng = random.Random(11)
    for case in range(300):
        text = "".join(rng.choice('[{]}ab"\\\n') for _ in range(rng.randrange(0, 2_000)))
        levels = rng.choice([0, 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 5])
        plain = rng.random() < 0.5  # brackets only in the text and the nesting, or in keys and strings too
        nested: object = "x" if plain else "x[{"
        for k in range(levels):
            nested = [nested] if k % 2 else {("k" if plain else "[k"): nested}
        extra = {"k": ""} if plain else {"k{": "[" * rng.randrange(600)}
        raw = json.dumps({"text": text, "m": nested, **extra}).encode()
        if rng.random() < 0.3:  # a bracket of the text written as an escape: json.dumps never does
            raw = raw.replace(b"ab", rng.choice([b"\\u005b", b"\\u007B", b"\\u005Bb"]), 1)
        parsed = json.loads(raw)["text"]
        assert too_deep(raw, parsed) == too_deep(raw) == (nesting_depth(raw) > MAX_DEPTH), (case, levels)
        assert bracket_count(raw) == raw.count(b"[") + raw.count(b"{")
    long = bytes(rng.randrange(256) for _ in range(50_000))
    assert bracket_count(long) == long.count(b"[") + long.count(b"{")


def test_a_long_text_with_short_metadata_is_cleared_without_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line whose parsed text leaves at most MAX_DEPTH bytes (a dolma line) is cleared before any pass over it,
    whatever its text holds (brackets, escapes, multi-byte characters); one with more than MAX_DEPTH bytes besides
    its text is counted, and a line nested past the limit is still found."""
    import json

    from olmo_data import documents
    from olmo_data.documents import MAX_DEPTH, too_deep

    def no_count(raw: bytes) -> int:
        raise AssertionError("counted")

    text = "[{" * 5_000 + '\n"é😀' * 20  # (these take 1, 1, 1 and 3 bytes more than a character each)
    for meta in ({}, {"m": "x" * (MAX_DEPTH - 200)}):
        raw = json.dumps({"id": "a", "text": text, **meta}, ensure_ascii=False).encode()
        assert len(raw) - len(text) <= MAX_DEPTH
        monkeypatch.setattr(documents, "bracket_count", no_count)
        assert not too_deep(raw, text)
        monkeypatch.undo()
    nested: object = 0
    for _ in range(MAX_DEPTH + 1):
        nested = [nested]
    raw = json.dumps({"text": text, "m": nested}).encode()
    assert len(raw) - len(text) > MAX_DEPTH and too_deep(raw, text) and too_deep(raw)
    wide = json.dumps({"text": text, "m": "x" * (MAX_DEPTH + 10)}).encode()  # measured, and shallow
    monkeypatch.setattr(documents, "bracket_count", no_count)
    with pytest.raises(AssertionError, match="counted"):
        too_deep(wide, text)
    monkeypatch.undo()
    assert not too_deep(wide, text)
