"""The span search behind `trace --spans` (span_search): L(i) and the maximal spans with the suffix index and by
the scan equal the definition that the replaced code computed (every start against every position of every file),
on random texts with repeats, shard ends and passages longer than a shard's context; places are counted in full
and listed up to a limit, the same way in both modes; and the scan's memory does not follow the number of places."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.instances import open_from_config
from olmo_data.suffix_index import build_index, open_index
from olmo_data.trace.span_search import index_longest, scan_longest
from olmo_data.trace.spans import find_spans


def write_files(tmp_path: Path, arrays: list[np.ndarray], dtype: str = "uint16") -> dict[str, Any]:
    paths = []
    for k, a in enumerate(arrays):
        path = tmp_path / f"part-{k}.npy"
        np.asarray(a).astype(dtype).tofile(path)
        paths.append(str(path))
    return {"model": {"max_sequence_length": 16}, "data": {"paths": paths, "dtype": dtype}}


def reference_longest(files: list[np.ndarray], query: np.ndarray) -> np.ndarray:
    """L(i) by definition: the longest common prefix of query[i:] with the file at every position."""
    out = np.zeros(len(query), dtype=np.int64)
    for f in files:
        for i in range(len(query)):
            at = np.flatnonzero(f == query[i])
            length = 0
            while len(at):
                length += 1
                if i + length == len(query):
                    break
                at = at[at + length < len(f)]
                at = at[f[at + length] == query[i + length]]
            out[i] = max(out[i], length)
    return out


def reference_spans(files: list[np.ndarray], query: np.ndarray, k: int) -> list[tuple[int, int, list[list[int]]]]:
    """The maximal spans from L(i) (extensible neither way) and every place of each, per file."""
    longest = reference_longest(files, query)
    out = []
    for i in range(len(query)):
        if longest[i] >= k and (i == 0 or longest[i - 1] != longest[i] + 1):
            piece = query[i : i + longest[i]]
            places = []
            for f in files:
                windows = np.lib.stride_tricks.sliding_window_view(f, len(piece))
                places.append(np.flatnonzero((windows == piece).all(axis=1)).tolist())
            out.append((i, i + int(longest[i]), places))
    return out


def random_case(rng: np.random.Generator, n: int = 2500) -> tuple[list[np.ndarray], np.ndarray]:
    """Two files over few values (many short matches), with copies inside and across them, and a query made of
    their pieces, of random tokens, and of its own earlier pieces again (repeats in the text)."""
    files = [rng.integers(0, 5, n).astype(np.int64) for _ in range(2)]
    for _ in range(4):
        a, b, length = int(rng.integers(0, n - 200)), int(rng.integers(0, n - 200)), int(rng.integers(20, 200))
        files[int(rng.integers(0, 2))][b : b + length] = files[int(rng.integers(0, 2))][a : a + length]
    parts: list[np.ndarray] = []
    for _ in range(int(rng.integers(3, 7))):
        kind = int(rng.integers(0, 3))
        if kind == 0 or not parts:
            f, length = files[int(rng.integers(0, 2))], int(rng.integers(5, 150))
            at = int(rng.integers(0, n - length))
            parts.append(f[at : at + length])
        elif kind == 1:
            parts.append(rng.integers(0, 7, int(rng.integers(1, 10))))
        else:
            earlier = np.concatenate(parts)
            at = int(rng.integers(0, len(earlier)))
            parts.append(earlier[at : at + int(rng.integers(5, 60))])
    return files, np.concatenate(parts).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_index_and_scan_equal_the_definition_on_random_texts(seed: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(seed)
    files, query = random_case(rng)
    cfg = write_files(tmp_path, files)
    source = open_from_config(cfg)
    # short shards and contexts: matches cross shard ends and outgrow the windows
    build_index(source, shard_tokens=int(rng.integers(300, 1200)), context=int(rng.integers(3, 40)), progress=False)
    index = open_index(source)
    assert index is not None
    k = int(rng.integers(4, 10))
    want_longest = reference_longest(files, query)
    assert index_longest(index, query, False).tolist() == want_longest.tolist()
    at_least_k = want_longest >= k
    for got in (scan_longest(source, query, k, 10)[0], index_longest(index, query, False, k)):
        assert got[at_least_k].tolist() == want_longest[at_least_k].tolist()
        assert (got[~at_least_k] < k).all()
    want = reference_spans(files, query, k)
    assert want, "the case has no span"
    paths = cfg["data"]["paths"]
    for found in (find_spans(source, query.tolist(), k)[0], find_spans(source, query.tolist(), k, index=index)[0]):
        got = [(i, j, [at[p].tolist() for p in paths]) for i, j, at, _ in found]
        assert got == want
        assert [c for _, _, _, c in found] == [sum(map(len, places)) for _, _, places in want]
    for i, j, places in want:  # one n-gram's count and places, as `trace --tokens` and a count look them up
        assert index.count(query[i:j].tolist()) == sum(map(len, places))
        assert [index.find(query[i:j].tolist())[p].tolist() for p in paths] == places


def test_a_text_held_whole_and_repeated(tmp_path: Path) -> None:
    """The text is a long stretch of the data, then the same stretch again: L falls by one a start to the end of
    each copy, and the walk settles both with a few searches."""
    rng = np.random.default_rng(11)
    data = rng.integers(0, 300, 20_000).astype(np.int64)
    cfg = write_files(tmp_path, [data])
    source = open_from_config(cfg)
    build_index(source, shard_tokens=6000, context=50, progress=False)
    index = open_index(source)
    assert index is not None
    query = np.concatenate([data[100:1300], data[5000:5400], data[100:1300]])
    longest, scanned = index_longest(index, query, False), scan_longest(source, query, 8, 10)[0]
    assert longest[longest >= 8].tolist() == scanned[longest >= 8].tolist() and (scanned[longest < 8] < 8).all()
    assert longest[:1190].tolist() == list(range(1200, 10, -1))  # the copy, to its end (not the text's)
    spans = [(i, j) for i, j, _, _ in find_spans(source, query.tolist(), 8, index=index)[0]]
    assert spans == [(i, j) for i, j, _, _ in find_spans(source, query.tolist(), 8)[0]]
    assert spans == [(0, 1200), (1200, 1600), (1600, 2800)]


def test_places_are_counted_in_full_and_listed_up_to_the_limit(tmp_path: Path) -> None:
    """A 12-token line repeated 3,000 times over two files: the span is counted 3,000 times and its first 7
    places listed (by file, then position), with the index and by the scan."""
    rng = np.random.default_rng(2)
    line = rng.integers(10, 100, 12)
    chunks = [np.concatenate([line, [int(rng.integers(100, 200))]]) for _ in range(3000)]
    files = [np.concatenate(chunks[:1000]), np.concatenate(chunks[1000:])]
    cfg = write_files(tmp_path, files)
    source = open_from_config(cfg)
    build_index(source, shard_tokens=5000, context=20, progress=False)
    index = open_index(source)
    query = [7, *line.tolist(), 8]
    results = []
    for idx in (None, index):
        found, _ = find_spans(source, query, 8, index=idx, max_places=7)
        assert [(i, j, c) for i, j, _, c in found] == [(1, 13, 3000)]
        results.append({p: v.tolist() for p, v in found[0][2].items()})
    paths = cfg["data"]["paths"]
    assert results[0] == results[1] == {paths[0]: [13 * k for k in range(7)], paths[1]: []}
    found, _ = find_spans(source, query, 8, index=index, max_places=2500)
    assert [len(found[0][2][p]) for p in paths] == [1000, 1500]


def test_the_report_says_how_many_places_it_did_not_list(tmp_path: Path, demo_tokenizer: str) -> None:
    line = list(range(20, 32))
    data = np.array((line + [5, 6]) * 40, dtype=np.int64)
    cfg = write_files(tmp_path, [data])
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep", save_folder=str(tmp_path / "run"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    from olmo_data.dataset.order import build_config_orders

    build_config_orders(cfg, epochs=1)
    from olmo_data.trace.spans import format_spans, trace_spans

    report = trace_spans(str(config), tokens=[3, *line, 3], max_places=3, tokenizer=demo_tokenizer)
    text = format_spans(report)
    assert re.search(r": 40 place\(s\), trained at [1-9]\d* step\(s\) \(the 3 listed\)\n", text), text
    assert "  ... and 37 more places (--json lists 3; the others are counted only)\n" in text
    doc = report.to_json()
    assert doc["max_places"] == 3
    assert [(s["start"], s["end"], s["count"], s["unlisted"], len(s["places"])) for s in doc["spans"]] == [
        (1, 13, 40, 37, 3)
    ]
    json.dumps(doc)
    bad = CliRunner().invoke(main, ["trace", str(config), "--spans", "x", "--max-places", "-1"])
    assert bad.exit_code == 2 and "--max-places -1: expected a number of places, 0 or more" in bad.output


def test_the_scan_of_a_repetitive_text_stays_small(tmp_path: Path) -> None:
    """A line the data holds 2,000 times and the text 100 times (3,000 tokens): 200,000 (place, start) pairs,
    which the replaced scan compared as rows as long as the text (~1.5 GB at once). Here the peak numpy memory
    is that of one bounded batch, and the answer is the index's."""
    rng = np.random.default_rng(4)
    line = rng.integers(10, 60, 25)
    data = np.concatenate([np.concatenate([line, rng.integers(100, 200, 3)]) for _ in range(2000)])
    query = np.concatenate([np.concatenate([line, [300 + k % 5, 301 + k % 5, 302]]) for k in range(100)])
    cfg = write_files(tmp_path, [data])
    source = open_from_config(cfg)
    tracemalloc.start()
    try:
        scanned, _ = find_spans(source, query.tolist(), 8, max_places=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 300 << 20, peak
    assert len(scanned) == 100 and all(c == 2000 and j - i == 25 for i, j, _, c in scanned)
    build_index(source, shard_tokens=20_000, context=30, progress=False)
    indexed, _ = find_spans(source, query.tolist(), 8, index=open_index(source), max_places=5)
    as_lists = [[(i, j, {p: v.tolist() for p, v in m.items()}, c) for i, j, m, c in s] for s in (scanned, indexed)]
    assert as_lists[0] == as_lists[1]


def test_matches_that_overlap_by_more_than_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """X Y and Y Z in the data, X Y Z in the text, Y longer than the capped search: the second span starts 100
    tokens before the first ends, found by galloping back from the cap."""
    import olmo_data.trace.span_search as search

    rng = np.random.default_rng(8)
    x, y, z, sep = (rng.integers(0, 1000, n) for n in (90, 100, 110, 5))
    data = np.concatenate([sep, x, y, sep + 1000, y, z, sep])
    cfg = write_files(tmp_path, [data])
    source = open_from_config(cfg)
    build_index(source, shard_tokens=150, context=20, progress=False)
    index = open_index(source)
    assert index is not None
    overlaps = []
    original = search._first_held

    def first_held(*args: Any) -> int:
        found = int(original(*args))
        overlaps.append(args[4] - 1 - found)  # how far before the match's end the next one starts
        return found

    monkeypatch.setattr(search, "_first_held", first_held)
    query = np.concatenate([[2000], x, y, z, [2001]])
    longest = index_longest(index, query, False)
    assert longest.tolist() == reference_longest([data], query).tolist() and max(overlaps) == 100 > search.CAP
    spans = [(i, j) for i, j, _, _ in find_spans(source, query.tolist(), 8, index=index)[0]]
    assert spans == [(i, j) for i, j, _, _ in find_spans(source, query.tolist(), 8)[0]] == [(1, 191), (91, 301)]


def test_a_progress_bar_only_when_asked_or_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both searches draw a bar once they take longer than PROGRESS_DELAY (made 0 here), on a terminal or with
    --progress; under pytest (not a terminal) the default draws none."""
    import olmo_data.trace.scan as scan
    import olmo_data.trace.span_search as search

    monkeypatch.setattr(search, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(scan, "PROGRESS_DELAY", 0.0)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 50, 3000)
    cfg = write_files(tmp_path, [data])
    source = open_from_config(cfg)
    build_index(source, shard_tokens=1000, context=10, progress=False)
    index = open_index(source)
    assert index is not None
    query = data[100:400].tolist()
    for progress, drawn in ((None, False), (True, True)):
        find_spans(source, query, 8, index=index, progress=progress)
        find_spans(source, query, 8, progress=progress)
        err = capsys.readouterr().err
        assert ("spans: 100%" in err and "search: 100%" in err) is drawn, err


def test_the_scan_in_chunks_and_processes_finds_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 700 tokens over two processes: matches that begin in one chunk and run into the next, and places
    met out of order, reduce to the one-chunk answer."""
    import olmo_data.trace.scan as scan

    files, query = random_case(np.random.default_rng(9))
    source = open_from_config(write_files(tmp_path, files))
    whole, _ = find_spans(source, query.tolist(), 6, max_places=3)
    monkeypatch.setattr(scan, "SCAN_CHUNK", 700)  # the one scan driver's chunks
    chunked, _ = find_spans(source, query.tolist(), 6, max_places=3, processes=2)
    as_lists = [[(i, j, {p: v.tolist() for p, v in m.items()}, c) for i, j, m, c in s] for s in (whole, chunked)]
    assert as_lists[0] == as_lists[1] != []
