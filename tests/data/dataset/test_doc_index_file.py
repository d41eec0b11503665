"""The range-readable document index (`part-N.docs.idx`): the same documents as the index built from the whole
metadata and as a scan of its rows, local and over HTTP; a remote lookup reads a few ranges (never the .csv.gz),
a batch's files at once; stale, damaged and overlapping inputs are passed over or refused by name."""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.doc_index import DocIndex, DocumentSpan, FileIndex
from olmo_data.dataset.doc_index_file import HEADER, index_path_for, parse_head, write_index_file
from olmo_data.dataset.doc_index_ranges import RangeFileIndex
from olmo_data.errors import DataError
from olmo_data.remote import RemoteOptions, RemoteReader
from tests.flaky_server import FlakyServer

K = 5  # a small sample step: lookups cross block boundaries at every few documents

Row = tuple[int, int, str, str, int]


def random_rows(rng: random.Random, n: int) -> list[Row]:
    """Documents in token order with gaps, empty documents and ids a CSV must quote (commas, quotes, newlines,
    non-ASCII, empty, repeated)."""
    rows, at = [], 0
    for k in range(n):
        at += rng.choice([0, 0, 0, 1, 7])
        length = rng.choice([0, 1, 3, 10, 40, 200])
        doc_id = rng.choice([f"doc-{k}", f'q"{k},x', f"ü-{k}\nz", "", "dup", f"{k}"])
        rows.append((at, at + length, doc_id, f"src/{rng.randrange(4)}.jsonl.gz", rng.randrange(1, 10**6)))
        at += length
    return rows


def write_metadata(path: Path, rows: list[Row]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    return str(path)


def scanned(rows: list[Row], start: int, end: int) -> list[DocumentSpan]:
    """The reference: every row that ends after `start` and starts before `end`, one by one."""
    out = []
    for s, e, doc_id, src, loc in rows:
        if e > start and s < end:
            lo = max(s, start)
            out.append(DocumentSpan(doc_id, src, loc, s, e, lo - start, min(e, end) - start, lo - s))
    return out


def spans_to_ask(rng: random.Random, rows: list[Row], count: int = 60) -> list[tuple[int, int]]:
    top = rows[-1][1] + 5 if rows else 10
    out = [(0, 1), (0, top), (top, top + 3)]
    for _ in range(count):
        a = rng.randrange(0, top)
        out.append((a, a + rng.choice([1, 2, 8, 64, 500])))
    if rows:
        out += [(rows[k][0], rows[k][1]) for k in rng.sample(range(len(rows)), min(10, len(rows)))]
    return out


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, list[Row]]:
    """Token files (their names only) and metadata of 0, 1, K, and a few hundred documents."""
    rng = random.Random(7)
    out = {}
    for i, n in enumerate([0, 1, K, K + 1, 333]):
        rows = random_rows(rng, n)
        write_metadata(tmp_path / "www" / "tok" / f"part-{i}.csv.gz", rows)
        (tmp_path / "www" / "tok" / f"part-{i}.npy").write_bytes(b"")
        out[f"part-{i}"] = rows
    return out


def test_the_file_and_the_built_index_give_the_documents_a_scan_gives(
    tmp_path: Path, corpus: dict[str, list[Row]]
) -> None:
    rng = random.Random(1)
    tok = tmp_path / "www" / "tok"
    built, ranged = DocIndex(str(tmp_path / "c1")), DocIndex(str(tmp_path / "c2"))
    for stem in corpus:
        head = write_index_file(str(tok / f"{stem}.csv.gz"), index_path_for(str(tok / f"{stem}.csv.gz")), K)
        assert head.documents == len(corpus[stem])
    (tmp_path / "hidden").mkdir()
    for stem, rows in corpus.items():  # the built index: the metadata alone, elsewhere
        (tmp_path / "hidden" / f"{stem}.csv.gz").write_bytes((tok / f"{stem}.csv.gz").read_bytes())
        token, meta = str(tok / f"{stem}.npy"), str(tmp_path / "hidden" / f"{stem}.csv.gz")
        assert isinstance(ranged.index_for(token), RangeFileIndex)
        assert isinstance(built.index_for(token, meta), FileIndex)
        for a, b in spans_to_ask(rng, rows):
            want = scanned(rows, a, b)
            assert built.lookup(token, a, b, meta) == want, (stem, a, b)
            assert ranged.lookup(token, a, b) == want, (stem, a, b)
    assert ranged.built == 0 and built.built == len(corpus)


def test_whole_columns_ids_and_lengths_equal_the_built_index(tmp_path: Path, corpus: dict[str, list[Row]]) -> None:
    tok = tmp_path / "www" / "tok"
    for stem, rows in corpus.items():
        meta = str(tok / f"{stem}.csv.gz")
        write_index_file(meta, tmp_path / "idx" / f"{stem}.docs.idx", K)
        head = parse_head((tmp_path / "idx" / f"{stem}.docs.idx").read_bytes(), stem)
        sources = sorted({r[3] for r in rows})
        assert sorted(head.sources) == sources
        assert head.head_size == HEADER.size + 24 * -(-len(rows) // K) + len(json.dumps(head.sources).encode())
        ranged = RangeFileIndex(head, str(tmp_path / "idx" / f"{stem}.docs.idx"))
        built = DocIndex(str(tmp_path / "c")).index_for(str(tok / f"{stem}.npy"), meta)
        assert isinstance(built, FileIndex)
        for name in ("starts", "ends", "locs", "src_codes", "id_offsets", "ids"):
            assert np.array_equal(np.asarray(getattr(ranged, name)), np.asarray(getattr(built, name))), name
        lengths, counts = ranged.length_counts()
        values, expected = np.unique([e - s for s, e, *_ in rows], return_counts=True)
        assert lengths.tolist() == values.tolist() and counts.tolist() == expected.tolist()
        for wanted in (["dup"], [""], [rows[-1][2]] if rows else ["x"], ["absent", "dup"]):
            rows_found = [k for k, r in enumerate(rows) if r[2] in wanted]
            assert ranged.rows_with_ids(wanted) == rows_found == built.rows_with_ids(wanted), (stem, wanted)
        assert [ranged.doc(k) for k in range(len(rows))] == [(r[2], r[3], r[4], r[0], r[1]) for r in rows]


def test_over_http_a_batch_reads_a_few_ranges_of_each_file_and_never_the_metadata(
    tmp_path: Path, corpus: dict[str, list[Row]], fresh_reader: RemoteReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(2)
    tok = tmp_path / "www" / "tok"
    for stem in corpus:
        write_index_file(str(tok / f"{stem}.csv.gz"), index_path_for(str(tok / f"{stem}.csv.gz")), K)
    with FlakyServer(tmp_path / "www") as server:
        urls = {stem: f"{server.url}/tok/{stem}.npy" for stem in corpus}
        asks = [(stem, a, b) for stem, rows in corpus.items() for a, b in spans_to_ask(rng, rows, 8)]
        expected = [scanned(corpus[s], a, b) for s, a, b in asks]
        docs = DocIndex(str(tmp_path / "cache"))
        docs.prepare([(urls[s], None, a, b) for s, a, b in asks])
        first = server.requests
        assert [docs.lookup(urls[s], a, b) for s, a, b in asks] == expected
        assert server.requests == first  # prepared: the lookups read nothing
        assert server.heads == len(corpus)  # each .csv.gz sized; each .docs.idx sized by the GET of its head
        assert not [p for p in server.ranges_by_file if p.endswith(".csv.gz")]  # the metadata: never read
        assert docs.built == 0

        monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader(RemoteOptions.from_env()))
        again = DocIndex(str(tmp_path / "cache"))  # a later command, the same batch: its answers from the cache
        again.prepare([(urls[s], None, a, b) for s, a, b in asks])
        assert [again.lookup(urls[s], a, b) for s, a, b in asks] == expected
        assert server.heads == len(corpus)  # (sizes: this process's memo; another's: the disk cache)
        assert server.requests - first == 1  # the folder's manifest.json (404), nothing of the index files

        monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader(RemoteOptions.from_env()))
        other = [(s, a + 1, b + 3) for s, a, b in asks]  # another batch: heads from the disk cache, blocks and ids
        before = server.requests
        third = DocIndex(str(tmp_path / "cache"))
        third.prepare([(urls[s], None, a, b) for s, a, b in other])
        assert [third.lookup(urls[s], a, b) for s, a, b in other] == [scanned(corpus[s], a, b) for s, a, b in other]
        assert 0 < server.requests - before <= 1 + 2 * (len(corpus) - 1)  # 2 per file with documents, at most

        monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader(RemoteOptions.from_env()))
        one = DocIndex(str(tmp_path / "cache"))  # an unprepared lookup: its blocks (one request), its ids (one)
        s, a, b = next((s, a, b) for s, a, b in reversed(asks) if len(scanned(corpus[s], a, b)) > 1)
        before = server.requests
        assert one.lookup(urls[s], a, b, f"{server.url}/tok/{s}.csv.gz") == scanned(corpus[s], a, b)
        assert server.requests - before == 2  # (the metadata named: no manifest.json asked for)


def test_without_an_index_file_the_remote_metadata_is_built_as_before(
    tmp_path: Path, corpus: dict[str, list[Row]], fresh_reader: RemoteReader
) -> None:
    with FlakyServer(tmp_path / "www") as server:
        url = f"{server.url}/tok/part-4.npy"
        docs = DocIndex(str(tmp_path / "cache"))
        assert docs.lookup(url, 0, 100) == scanned(corpus["part-4"], 0, 100)
        assert docs.built == 1 and isinstance(docs.index_for(url), FileIndex)


def test_a_stale_or_damaged_index_is_passed_over_with_a_warning(
    tmp_path: Path, corpus: dict[str, list[Row]], caplog: pytest.LogCaptureFixture
) -> None:
    tok = tmp_path / "www" / "tok"
    meta = str(tok / "part-4.csv.gz")
    write_index_file(meta, index_path_for(meta), K)
    rows = corpus["part-4"][:-3]
    write_metadata(tok / "part-4.csv.gz", rows)  # rewritten after its index: another size
    with caplog.at_level(logging.WARNING):
        assert DocIndex(str(tmp_path / "c1")).lookup(str(tok / "part-4.npy"), 0, 10**6) == scanned(rows, 0, 10**6)
    assert "built from a metadata file of" in caplog.text
    write_index_file(meta, index_path_for(meta), K)
    damaged = bytearray(Path(index_path_for(meta)).read_bytes())
    damaged[HEADER.size + 3] ^= 0xFF  # a sampled start
    Path(index_path_for(meta)).write_bytes(bytes(damaged))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert DocIndex(str(tmp_path / "c2")).lookup(str(tok / "part-4.npy"), 5, 50) == scanned(rows, 5, 50)
    assert "damaged" in caplog.text


def test_rows_past_the_token_file_are_refused_alike(tmp_path: Path, corpus: dict[str, list[Row]]) -> None:
    tok = tmp_path / "www" / "tok"
    meta = str(tok / "part-4.csv.gz")
    rows, n = corpus["part-4"], corpus["part-4"][-1][1] - 50
    errors = []
    for use_file in (False, True):
        if use_file:
            write_index_file(meta, index_path_for(meta), K)
        docs = DocIndex(str(tmp_path / f"c{use_file}"))
        docs.prepare([(str(tok / "part-4.npy"), None, 0, 5)])  # (prepared or not: checked when looked up)
        with pytest.raises(DataError) as e:
            docs.lookup(str(tok / "part-4.npy"), 0, 5, num_tokens=n)
        errors.append(str(e.value))
    row = next(k for k, r in enumerate(rows) if r[1] > n)
    assert errors[0] == errors[1] and f"row {row + 1} ends at token {rows[row][1]}" in errors[0]


def test_overlapping_documents_are_refused_naming_the_row(tmp_path: Path) -> None:
    meta = write_metadata(tmp_path / "m.csv.gz", [(0, 10, "a", "s", 1), (2, 5, "b", "s", 2)])
    with pytest.raises(DataError, match=r"m\.csv\.gz: row 2 ends at token 5, before row 1's end 10"):
        write_index_file(meta, tmp_path / "m.docs.idx")
    assert not list(tmp_path.glob("*.docs.idx")) and not list(tmp_path.glob(".tmp-*"))


def test_tokenize_output_indexed_gives_the_documents_the_built_index_gives(
    tmp_path: Path, demo_token_parts: list[str]
) -> None:
    """On real `olmo-data tokenize` output (ids FILE:LINE, one source per shard), copied so the shared parts keep
    no index file: every part's documents at random ranges, both ways."""
    rng = random.Random(3)
    for k, part in enumerate(demo_token_parts[:4]):
        meta = Path(part[: -len(".npy")] + ".csv.gz")
        copy = tmp_path / "tok" / meta.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(meta.read_bytes())
        write_index_file(str(copy), index_path_for(str(copy)), sample_every=16)
        ranged, built = DocIndex(str(tmp_path / f"r{k}")), DocIndex(str(tmp_path / f"b{k}"))
        tokens = Path(part).stat().st_size // 4  # (at most: uint16 or uint32 ids)
        asks = [(a, a + rng.choice([16, 128, 1024])) for a in (rng.randrange(0, tokens) for _ in range(30))]
        ranged.prepare([(str(copy.with_suffix("").with_suffix(".npy")), str(copy), a, b) for a, b in asks])
        found = 0
        for a, b in asks:
            want = built.lookup(part, a, b, str(meta))
            assert ranged.lookup(str(copy.with_suffix("").with_suffix(".npy")), a, b, str(copy)) == want
            found += len(want or [])
        assert found >= len(asks)  # (every range within the file holds a document)
        assert isinstance(ranged.index_for(str(copy.with_suffix("").with_suffix(".npy"))), RangeFileIndex)
