"""`olmo-data index`: suffix arrays agree with sorting the suffixes in Python; lookups through the index give the
scan's places exactly (uint16 and uint32 files, shard ends, passages longer than a shard's context); builds resume;
a changed token file's index is refused, then rebuilt where it changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.instances import open_from_config
from olmo_data.errors import DataError
from olmo_data.suffix_index import build_index, open_index
from olmo_data.suffix_index.layout import index_folder
from olmo_data.suffix_index.sort import have_divsufsort, suffix_array
from olmo_data.trace.find import find_tokens
from olmo_data.trace.spans import find_spans


def python_suffix_array(tokens: np.ndarray) -> list[int]:
    values = tokens.tolist()
    return sorted(range(len(values)), key=lambda i: values[i:])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_suffix_arrays_sort_suffixes(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    for alphabet, n in ((3, 400), (50, 300), (2**32 - 5 if dtype == np.uint32 else 65535, 200)):
        tokens = rng.integers(0, alphabet, n).astype(dtype)
        tokens[100:160] = tokens[20:80]  # a long repeat needs several doubling rounds
        expected = python_suffix_array(tokens)
        assert suffix_array(tokens, "numpy").tolist() == expected
        if have_divsufsort():
            assert suffix_array(tokens, "divsufsort").tolist() == expected


def make_files(tmp_path: Path, dtype: str, n: int = 3000, seed: int = 1) -> tuple[list[str], dict[str, Any]]:
    """Two plain token files of few distinct values (many repeats), with long copies inside and across files."""
    rng = np.random.default_rng(seed)
    np_dtype = np.dtype(dtype)
    scale = 1_000_003 if dtype == "uint32" else 7
    paths = []
    arrays = [rng.integers(0, 4, n).astype(np.int64) * scale for _ in range(2)]
    arrays[0][1000:1100] = arrays[0][100:200]  # a 100-token copy within a file
    arrays[1][n - 50 :] = arrays[0][10:60]  # ... and at the other file's very end
    for k, a in enumerate(arrays):
        path = tmp_path / f"part-{k}.npy"
        a.astype(np_dtype).tofile(path)
        paths.append(str(path))
    cfg = {"model": {"max_sequence_length": 16}, "data": {"paths": paths, "dtype": dtype}}
    return paths, cfg


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_index_lookups_equal_the_scan(dtype: str, tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, dtype)
    source = open_from_config(cfg)
    # small shards and a short context: passages cross shard ends and outgrow the context
    summary = build_index(source, shard_tokens=500, context=7, progress=False)
    assert summary.shards == 12 and summary.built == 12 and summary.bytes_per_token > 4
    index = open_index(source)
    assert index is not None
    files = [np.fromfile(p, dtype=dtype) for p in paths]
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(150):
        f, length = int(rng.integers(0, 2)), int(rng.integers(1, 40))
        at = int(rng.integers(0, 3000 - length))
        seq = files[f][at : at + length].astype(np.int64).tolist()
        if trial % 3 == 0:
            seq[-1] = 3  # a value no file holds: found nowhere
        scanned, _ = find_tokens(source, seq, name="x", progress=False)
        indexed, _ = find_tokens(source, seq, name="x", progress=False, index=index)
        assert indexed == scanned, (trial, seq)
        checked += len(scanned)
        if trial % 10 == 0:  # the longest match from the first starts, against a brute force over both files
            starts = np.arange(min(length, 3))
            want = [max(_common(f[p:], seq[i:]) for f in files for p in range(len(f))) for i in starts.tolist()]
            assert index.longest(seq, starts).tolist() == want
    assert checked > 150


def _common(a: np.ndarray, b: list[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n].astype(np.int64) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def test_spans_with_and_without_the_index_equal_a_brute_force(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16", n=1500)
    source = open_from_config(cfg)
    build_index(source, shard_tokens=400, context=5, progress=False)
    index = open_index(source)
    files = [np.fromfile(p, dtype=np.uint16).astype(np.int64) for p in paths]
    data = [bytes(np.asarray(f, dtype=">u2").tobytes()) for f in files]
    rng = np.random.default_rng(5)
    total = 0
    for _ in range(10):
        a, b = int(rng.integers(0, 1400)), int(rng.integers(0, 1400))
        query = [*files[0][a : a + 20].tolist(), 9, 9, *files[1][b : b + 15].tolist()]

        def held(i: int, j: int, query: list[int] = query) -> bool:
            needle = np.asarray(query[i:j], dtype=">u2").tobytes()
            return any(_find_aligned(d, needle) for d in data)

        expected = [
            (i, j)
            for i in range(len(query))
            for j in range(i + 6, len(query) + 1)
            if held(i, j) and (i == 0 or not held(i - 1, j)) and (j == len(query) or not held(i, j + 1))
        ]
        scanned, _ = find_spans(source, query, 6)
        indexed, _ = find_spans(source, query, 6, index=index)
        assert [(i, j) for i, j, _, _ in scanned] == expected
        total += len(expected)
        assert [(i, j, {p: v.tolist() for p, v in m.items()}, c) for i, j, m, c in indexed] == [
            (i, j, {p: v.tolist() for p, v in m.items()}, c) for i, j, m, c in scanned
        ]
    assert total >= 20


def _find_aligned(data: bytes, needle: bytes) -> bool:
    at = data.find(needle)
    while at >= 0:
        if at % 2 == 0:
            return True
        at = data.find(needle, at + 1)
    return False


def test_a_build_resumes_and_a_changed_file_is_refused_then_rebuilt(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint32")
    source = open_from_config(cfg)
    first = build_index(source, shard_tokens=1000, context=8, progress=False)
    assert (first.shards, first.built) == (6, 6)
    folder = index_folder(paths[1])
    # a build killed after two shards of the second file: their .json were written, the rest not
    (folder / "manifest.json").unlink()
    (folder / "shard-00002.json").unlink()
    (folder / ".tmp-shard-00002.u32.x1y2").write_bytes(b"half")
    with pytest.raises(DataError, match=r"part-1.npy: no suffix index, though 1 other token file"):
        open_index(source)
    again = build_index(source, shard_tokens=1000, context=8, progress=False)
    assert (again.built, again.built_tokens) == (1, 1000)
    assert not list(folder.glob(".tmp-*")) and again.index_bytes < 4 * 6000 + 6000
    assert build_index(source, shard_tokens=1000, context=8, progress=False).built == 0
    # the token file changes: the index is refused, with what to do
    tokens = np.fromfile(paths[1], dtype=np.uint32)
    tokens[2500] += 1
    tokens.tofile(paths[1])
    with pytest.raises(DataError, match=r"built for another version of .*part-1.npy.*rerun `olmo-data index"):
        open_index(source)
    rebuilt = build_index(source, shard_tokens=1000, context=8, progress=False)
    assert rebuilt.built == 1 and "part-1.npy changed since its index was built" in rebuilt.messages[0]
    index = open_index(source)
    assert index is not None
    seq = tokens[2490:2510].astype(np.int64).tolist()
    scanned, _ = find_tokens(source, seq, name="x", progress=False)
    assert index.find(seq)[paths[1]].tolist() == [t.start for t in scanned if t.file_index == 1] == [2490]


def test_the_command_builds_in_parallel_into_a_chosen_folder(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16")
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "index"
    args = ["index", str(tmp_path / "config.yaml"), "--index-dir", str(out), "--shard-tokens", "700", "-p", "2"]
    res = CliRunner().invoke(main, [*args, "--engine", "numpy"])
    assert res.exit_code == 0, res.output
    assert "indexed 2 token file(s), 6,000 tokens in 10 shard(s): sorted 10" in res.output
    assert not (tmp_path / "suffix-index").exists() and len(list(out.glob("*-part-0.npy/shard-*.u32"))) == 5
    res = CliRunner().invoke(main, args)
    assert "sorted 0 (0 tokens)" in res.output and "10 already done" in res.output
    seq = ",".join(str(t) for t in np.fromfile(paths[0], dtype=np.uint16)[200:212].tolist())
    base = ["trace", str(tmp_path / "config.yaml"), "--tokens", seq]
    indexed = CliRunner().invoke(main, [*base, "--index-dir", str(out)])
    scanned = CliRunner().invoke(main, [*base, "--no-index"])
    assert indexed.exit_code == 0 and "looked up in the suffix index of 6,000 tokens" in indexed.output
    assert indexed.output.splitlines()[2:] == scanned.output.splitlines()[2:]
    bad = CliRunner().invoke(main, ["index", str(tmp_path / "config.yaml"), "--shard-tokens", "0"])
    assert bad.exit_code == 2 and "shard_tokens 0 and context 4096: expected positive" in bad.output


def test_a_rebuild_with_other_settings_never_leaves_a_manifest_over_mixed_shards(tmp_path: Path) -> None:
    """Rerunning with another --shard-tokens rewrites the shards: the old manifest goes first, so a rebuild killed
    midway leaves no index (the scan answers), and a manifest over mixed shards (put back) is refused."""
    paths, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    build_index(source, shard_tokens=1000, context=8, progress=False)
    folder = index_folder(paths[0])
    old_manifest = (folder / "manifest.json").read_bytes()
    import olmo_data.suffix_index.index as si

    built = []

    def dying(task: Any) -> int:
        if built:
            raise KeyboardInterrupt
        built.append(task)
        return int(original(task))

    original, si._build_shard = si._build_shard, dying  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            build_index(source, shard_tokens=400, context=8, progress=False)
    finally:
        si._build_shard = original  # type: ignore[assignment]
    assert not (folder / "manifest.json").exists()
    (folder / "manifest.json").write_bytes(old_manifest)  # as the old code left it: shard 0 is now [0, 400)
    with pytest.raises(DataError, match=rf"^{folder}: the suffix index's shards do not cover the 3000 tokens of"):
        open_index(source)
    build_index(source, shard_tokens=400, context=8, progress=False)
    index = open_index(source)
    assert index is not None
    seq = np.fromfile(paths[0], dtype=np.uint16)[450:460].astype(np.int64).tolist()
    scanned, _ = find_tokens(source, seq, name="x", progress=False)
    found, _ = find_tokens(source, seq, name="x", progress=False, index=index)
    assert [(t.file_index, t.start) for t in found] == [(t.file_index, t.start) for t in scanned] != []


def test_an_index_of_another_dtype_is_refused(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16")
    build_index(open_from_config(cfg), shard_tokens=1000, context=8, progress=False)
    cfg["data"]["dtype"] = "uint32"
    manifest = index_folder(paths[0]) / "manifest.json"
    with pytest.raises(DataError, match=rf"^{manifest}: indexes 3000 uint16 tokens, but the run reads .* as 1500"):
        open_index(open_from_config(cfg))


def test_empty_token_files_are_skipped_by_index_and_queries(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16")
    empty = tmp_path / "part-2.npy"
    empty.write_bytes(b"")
    cfg["data"]["paths"].append(str(empty))
    source = open_from_config(cfg)
    assert build_index(source, shard_tokens=1000, context=8, progress=False).tokens == 6000
    index = open_index(source)
    assert index is not None
    query = np.fromfile(paths[1], dtype=np.uint16)[100:130].astype(np.int64).tolist()
    seq = query[:10]
    scanned, _ = find_tokens(source, seq, name="x", progress=False)
    found, _ = find_tokens(source, seq, name="x", progress=False, index=index)
    assert [(t.file_index, t.start) for t in found] == [(t.file_index, t.start) for t in scanned] != []
    indexed_spans, _ = find_spans(source, query, 8, index=index)
    scanned_spans, _ = find_spans(source, query, 8)
    as_lists = [
        [(i, j, {p: v.tolist() for p, v in m.items() if len(v)}, c) for i, j, m, c in s]
        for s in (indexed_spans, scanned_spans)
    ]
    assert as_lists[0] == as_lists[1] != []


def test_token_ids_outside_the_dtype_are_refused_and_never_match(tmp_path: Path) -> None:
    """-1 is the index's past-the-end marker: a query ending in it matched a file's last tokens through the index
    (never through the scan). The command refuses such ids; the index itself never matches them."""
    paths, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    build_index(source, shard_tokens=1000, context=8, progress=False)
    index = open_index(source)
    assert index is not None
    tail = np.fromfile(paths[1], dtype=np.uint16)[-3:].astype(np.int64).tolist()
    for seq in (tail + [-1], tail + [-1, -1]):
        assert [t.start for t in find_tokens(source, seq, name="x", progress=False)[0]] == []
        assert [t.start for t in find_tokens(source, seq, name="x", progress=False, index=index)[0]] == []
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    for ids, bad in ((f"{tail[0]},-1", "-1"), ("65536,3", "65536")):
        res = CliRunner().invoke(main, ["trace", str(tmp_path / "config.yaml"), "--tokens", ids])
        assert res.exit_code == 2 and f"error: --tokens: token id {bad} is outside 0..65535" in res.output, res.output
