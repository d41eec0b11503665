"""stats: per-file and per-source counts, document lengths and epochs, computed independently here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.config.duration import parse_duration
from olmo_data.dataset.instances import open_dataset
from olmo_data.dataset.mixture import build_mix, parse_spec
from olmo_data.dataset.stats import dataset_stats, format_stats
from olmo_data.errors import DataError


def token_dir(directory: Path, doc_lengths: list[list[int]]) -> str:
    """A token directory with one file per list of document lengths, with metadata rows for each document."""
    directory.mkdir(parents=True)
    files = []
    for k, lengths in enumerate(doc_lengths):
        name = f"part-{k:05d}-00000"
        np.arange(sum(lengths), dtype=np.uint16).tofile(directory / f"{name}.npy")
        with gzip.open(directory / f"{name}.csv.gz", "wt") as f:
            start = 0
            for i, n in enumerate(lengths):
                f.write(f"{start},{start + n},doc-{k}-{i},in.jsonl,{i + 1}\n")
                start += n
        files.append({"path": f"{name}.npy", "metadata": f"{name}.csv.gz", "tokens": sum(lengths)})
    (directory / "manifest.json").write_text(
        json.dumps({"format": "olmo-data.tokens", "version": 1, "dtype": "uint16", "files": files})
    )
    return str(directory)


def test_counts_lengths_and_epochs(tmp_path: Path) -> None:
    lengths = [[5, 17, 3], [40], [1, 1, 9, 30]]
    d = token_dir(tmp_path / "a", lengths)
    ds = open_dataset([d], sequence_length=8)
    st = dataset_stats(ds, global_batch_size=3, duration="2ep", cache_dir=str(tmp_path / "cache"))
    assert [f.tokens for f in st.files] == [25, 40, 41]
    assert [f.instances for f in st.files] == [3, 5, 5]
    assert [f.dropped_tokens for f in st.files] == [1, 0, 1]
    assert [f.documents for f in st.files] == [3, 1, 4]
    assert (st.num_instances, st.documents, st.file_tokens) == (13, 8, 106)
    every = np.array([n for file in lengths for n in file])
    assert st.document_lengths["p50"] == pytest.approx(np.percentile(every, 50))
    assert st.document_lengths["mean"] == pytest.approx(every.mean())
    assert sum(c for _, _, c in st.length_histogram) == 8
    for lo, hi, c in st.length_histogram:
        assert c == int(((every >= lo) & (every < hi)).sum())
    assert (st.batches_per_epoch, st.dropped_per_epoch, st.steps, st.epochs) == (4, 1, 8, 2.0)
    assert len(st.sources) == 1 and st.sources[0].instances == 13
    text = format_stats(st)
    assert "13 instances of 8 tokens" in text and "8 steps = 2.000 epochs" in text


def test_durations_in_steps_and_tokens(tmp_path: Path) -> None:
    ds = open_dataset([token_dir(tmp_path / "a", [[100]])], sequence_length=10)
    assert dataset_stats(ds, global_batch_size=2, duration=15, document_lengths=False).epochs == 3.0
    st = dataset_stats(ds, global_batch_size=2, duration="95T", document_lengths=False)
    assert st.steps == 5  # 95 tokens need 5 steps of 2 x 10 tokens
    assert parse_duration("2e9T") == (2e9, "tokens") and parse_duration("1.5ep") == (1.5, "epochs")
    with pytest.raises(DataError, match=r"duration '3 weeks': expected steps \(1000\), tokens \(2e9T\) or epochs"):
        parse_duration("3 weeks")
    for zero in (0, "0T", "0ep"):
        with pytest.raises(DataError, match=r"must be positive"):
            parse_duration(zero)


def test_mix_sources(tmp_path: Path) -> None:
    a = token_dir(tmp_path / "a", [[80], [80]])
    b = token_dir(tmp_path / "b", [[40]])
    spec = {
        "seed": 0,
        "sequence_length": 8,
        "sources": [{"name": "a", "paths": [a], "share": 0.5}, {"name": "b", "paths": [b], "share": 0.5}],
    }
    build_mix(parse_spec(spec), str(tmp_path / "mix"))
    st = dataset_stats(open_dataset(mix=str(tmp_path / "mix"), sequence_length=8), cache_dir=str(tmp_path / "c"))
    assert [(s.name, s.available_instances, s.instances) for s in st.sources] == [("a", 20, 5), ("b", 5, 5)]
    assert [s.share for s in st.sources] == [0.5, 0.5]


def test_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    d = token_dir(tmp_path / "a", [[30, 30], [50]])
    res = CliRunner().invoke(main, ["stats", d, "--sequence-length", "10", "--global-batch-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["num_instances"] == 11 and out["batches_per_epoch"] == 2 and out["documents"] == 3
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "global_train_batch_size": 2,
                "max_duration": "1ep",
                "model": {"max_sequence_length": 10},
                "data": {"paths": [d]},
            }
        )
    )
    res = CliRunner().invoke(main, ["stats", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "5 steps = 1.000 epochs" in res.output
    res = CliRunner().invoke(main, ["stats", d])
    assert res.exit_code == 2 and "--sequence-length is required without a CONFIG" in res.output


@pytest.mark.parametrize("seed", range(6))
def test_length_summary_from_counts_is_numpys_on_the_written_out_lengths(seed: int) -> None:
    """Percentiles (numpy's linear ones, bit for bit), mean and histogram from (length, count) pairs, as an index
    file's lengths section gives them, equal numpy's on the lengths one per document."""
    from olmo_data.dataset.stats import PERCENTILES, length_summary

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, [3, 50, 5_000, 2**20, 7, 100_000][seed], size=int(rng.integers(1, 3_000)))
    values, counts = np.unique(lengths, return_counts=True)
    summary, histogram = length_summary(values, counts)
    want = {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(lengths, PERCENTILES), strict=True)}
    assert summary == want | {"mean": float(lengths.mean())}
    edges = [0] + [2**i for i in range(int(np.log2(max(1, lengths.max()))) + 2)]
    binned, _ = np.histogram(lengths, bins=edges)
    assert histogram == [(edges[i], edges[i + 1], int(c)) for i, c in enumerate(binned) if c]
