"""A shard's sampled keys (written by the build, memory-mapped by queries) bracket every bound a binary search looks
for, at any sampling step; an index of the old format, or with a damaged keys file, is refused by name and rebuilt
by a rerun."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from olmo_cli.index import index as index_command
from olmo_data.dataset.instances import open_from_config
from olmo_data.errors import DataError
from olmo_data.suffix_index import build_index, open_index
from olmo_data.suffix_index.layout import SHARD_TOKENS, index_folder, shard_file
from olmo_data.suffix_index.search import Samples, bound_one, lower_bound
from tests.data.suffix_index.test_suffix_index import make_files, python_suffix_array


def true_bound(suffixes: list[list[int]], piece: list[int], above: bool) -> int:
    """Ranks of the suffixes that sort before the piece (lower bound), or before it or start with it (upper)."""
    return sum(1 for s in suffixes if s < piece or (above and s[: len(piece)] == piece))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_keys_bracket_every_bound_at_any_step(dtype: type) -> None:
    rng = np.random.default_rng(7)
    big = 2**32 - 3 if dtype == np.uint32 else 65535
    tokens = rng.choice(np.array([0, 1, 2, big], dtype=np.int64), 600).astype(dtype)
    tokens[300:340] = tokens[100:140]
    base, end, limit = 50, 450, 470  # a shard [50, 450) sorted up to 470, as the build windows it
    order = python_suffix_array(tokens[base:limit])
    positions = np.array([p for p in order if p < end - base], dtype=np.uint32)
    suffixes = [tokens[base + int(p) : limit].astype(np.int64).tolist() for p in positions]
    at, lengths = rng.integers(0, 590, 60), rng.integers(1, 12, 60)
    pieces = [tokens[a : a + n].astype(np.int64).tolist() for a, n in zip(at, lengths, strict=True)]
    pieces += [[3], [big, big, big, big, big, big, big, big, big], [0] * 20, [2, 1, 0, 3]]  # absent, repeated
    for step in (1, 3, 7, 256):
        samples = Samples.of(tokens, positions, base, limit, step)
        assert len(samples.keys) == -(-len(positions) // step)
        for piece in pieces:
            arr = np.array(piece, dtype=np.int64)
            for above in (False, True):
                want = true_bound(suffixes, piece, above)
                lo, hi = samples.bracket_one(arr, above)
                assert lo <= want <= hi, (step, piece, above)
                assert bound_one(tokens, positions, base, limit, arr, lo, hi, above=above) == want
        query = np.concatenate([np.array(p, dtype=np.int64) for p in pieces])
        starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
        lengths = np.array([len(p) for p in pieces])
        for above in (False, True):
            got, _, _ = lower_bound(
                tokens, positions, base, limit, query, starts, lengths, above=above, samples=samples
            )
            assert got.tolist() == [true_bound(suffixes, p, above) for p in pieces]


@pytest.mark.parametrize("version", [1, 2])
def test_an_index_of_an_old_format_is_refused_by_name_then_sorted_again(tmp_path: Path, version: int) -> None:
    """Formats 1 (no keys) and 2 (keys, no checksums of the shard files): neither records what its files should
    hold, so their shards are sorted again (to the same bytes) rather than trusted."""
    paths, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    build_index(source, shard_tokens=1000, context=8, progress=False)
    folder = index_folder(paths[0])
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    old = {k: v for k, v in manifest.items() if k != "sample_step" or version == 2}
    manifest_path.write_text(json.dumps({**old, "version": version}))
    files = {p.name: p.read_bytes() for p in folder.glob("shard-*.*")}
    for record in folder.glob("shard-*.json"):  # neither format recorded checksums
        meta = json.loads(record.read_text())
        record.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("positions", "keys")}))
    if version == 1:
        for path in folder.glob("shard-*.keys"):  # format 1 had none
            path.unlink()
    with pytest.raises(DataError, match=rf"is in format {version}, this olmo-data reads format 3; rerun `olmo-data"):
        open_index(source)
    summary = build_index(source, shard_tokens=1000, context=8, progress=False)
    assert summary.built == 3  # that file's shards, sorted again
    want = f"its index is in format {version}: sorting its shards again to record the checksums of their files"
    assert any(want in m for m in summary.messages), summary.messages
    assert {p.name: p.read_bytes() for p in folder.glob("shard-*.*")} == files
    assert json.loads(manifest_path.read_text()) == manifest
    index = open_index(source)
    assert index is not None and index.count([0, 7]) > 0


def test_damaged_keys_are_refused_by_file_then_rebuilt(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    build_index(source, shard_tokens=1000, context=8, progress=False)
    keys = shard_file(index_folder(paths[1]), 2, "keys")
    whole = keys.read_bytes()
    keys.write_bytes(whole[:-5])  # cut short
    with pytest.raises(DataError, match=rf"^{keys}: {len(whole) - 5} bytes, expected {len(whole)} bytes for its sh"):
        open_index(source)
    keys.unlink()
    with pytest.raises(DataError, match=rf"^{keys}: missing, expected {len(whole)} bytes"):
        open_index(source)
    assert build_index(source, shard_tokens=1000, context=8, progress=False).built == 1
    assert keys.read_bytes() == whole
    manifest_path = index_folder(paths[1]) / "manifest.json"
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "sample_step": 128}))
    with pytest.raises(DataError, match=r"manifest.json: sample_step 128, this olmo-data reads keys of every 256th"):
        open_index(source)


def test_the_command_defaults_to_the_library_shard_size() -> None:
    option = next(p for p in index_command.params if p.name == "shard_tokens")
    assert option.default == SHARD_TOKENS


def test_a_build_sorted_by_numpy_for_want_of_divsufsort_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default shard costs ~5 GB with numpy against ~1.7 GB with divsufsort: a user without the extra is told."""
    from click.testing import CliRunner

    from olmo_cli.main import main

    _, cfg = make_files(tmp_path, "uint16")
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(cfg))
    monkeypatch.setattr("olmo_data.suffix_index.sort.have_divsufsort", lambda: False)
    res = CliRunner().invoke(main, ["index", str(config), "--shard-tokens", "1000"])
    assert res.exit_code == 0, res.output
    assert "numpy), 0 already done" in res.output
    assert "note: sorted with numpy; `pip install 'olmo-data[index]'` sorts with divsufsort" in res.output
    explicit = CliRunner().invoke(main, ["index", str(config), "--shard-tokens", "900", "--engine", "numpy"])
    assert explicit.exit_code == 0 and "note:" not in explicit.output
