"""The search behind `olmo-data contamination`: one scan for many texts gives, text by text, exactly what
`find_spans` gives for each text alone (by its own scan and by the suffix index), including texts that share
k-grams, matches longer than the first extension, texts shorter than k and texts found nowhere."""

from __future__ import annotations

import numpy as np
import pytest

from olmo_data.dataset import InstanceSource
from olmo_data.dataset.instances import open_from_config
from olmo_data.errors import DataError
from olmo_data.suffix_index import build_index, open_index
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.trace.contamination import search_texts
from olmo_data.trace.spans import find_spans

K = 13


@pytest.fixture(scope="module")
def source(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> InstanceSource:
    root = tmp_path_factory.mktemp("contam-search")
    tokenize(demo_corpus[:1], root / "tokens", TokenizeOptions(tokenizer=demo_tokenizer))
    cfg = {
        "global_train_batch_size": 8,
        "model": {"max_sequence_length": 128},
        "data": {"paths": [str(root / "tokens")]},
    }
    return open_from_config(cfg)


def queries(source: InstanceSource) -> list[list[int]]:
    f = source.files[0]
    tokens = np.memmap(f.path, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(7)
    noise = [int(t) for t in rng.integers(2000, 2048, size=40)]  # rare ids: a run of them is found nowhere
    a, b, c = (tokens[s : s + n].tolist() for s, n in ((5_000, 150), (90_000, 30), (200_000, 20)))
    return [
        a,  # a 150-token passage: longer than the scan's first 64-token extension
        noise[:10] + b + noise[10:20] + c,  # two spans between made-up tokens
        b[5:] + noise[20:25],  # shares k-grams with the text before it
        c[: K - 1],  # shorter than k
        noise,  # found nowhere
        a[:80] + noise[:3] + a[60:140],  # the same passage twice, overlapping
    ]


def as_lists(
    found: list[tuple[int, int, dict[str, np.ndarray], int]],
) -> list[tuple[int, int, dict[str, list[int]], int]]:
    """Spans comparable across searches: files without a place left out."""
    return [(i, j, {p: v.tolist() for p, v in at.items() if len(v)}, count) for i, j, at, count in found]


def test_one_scan_for_all_texts_is_each_texts_own_search(source: InstanceSource) -> None:
    qs = queries(source)
    together, how = search_texts(source, qs, K, search="scan")
    assert how["index"] is False and how["searched"] == 5  # the text shorter than k is not searched
    alone = [find_spans(source, q, K)[0] for q in qs]
    assert [as_lists(f) for f in together] == [as_lists(f) for f in alone]
    assert [len(f) for f in together][:5] == [1, 2, 1, 0, 0] and together[0][0][1] - together[0][0][0] == 150

    build_index(source, shard_tokens=1 << 18, progress=False)  # several shards per file
    index = open_index(source)
    assert index is not None
    by_index, how = search_texts(source, qs, K, index=index, search="index")
    assert how["index"] is True and [as_lists(f) for f in by_index] == [as_lists(f) for f in together]


def test_bad_min_tokens_is_refused(source: InstanceSource) -> None:
    with pytest.raises(DataError, match="--min-tokens 0: expected a positive number of tokens"):
        search_texts(source, [[1, 2, 3]], 0)


def test_a_scan_by_a_pool_of_processes_gives_the_same(source: InstanceSource, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks, so that two processes share the scan: the workers read the texts from the folder the driver
    saved them in (no task carries them), and answer as one process does."""
    qs = queries(source)
    one, _ = search_texts(source, qs, K, search="scan")
    monkeypatch.setattr("olmo_data.trace.scan.SCAN_CHUNK", 1 << 14)  # the one pool rule (scan.pooled) reads it
    pooled: list[str] = []
    save = np.save

    def saved(path: str, array: np.ndarray) -> None:
        pooled.append(str(path))
        save(path, array)

    monkeypatch.setattr(np, "save", saved)
    two, _ = search_texts(source, qs, K, search="scan", processes=2)
    assert pooled and [as_lists(f) for f in two] == [as_lists(f) for f in one]
