"""The scan behind `olmo-data contamination` cuts a span's places as the suffix index and `trace --spans`' own scan
do: the first `keep` over the whole run (token files in the run's order, then offsets) with the count of all, and
it keeps no more than that in memory however many places hold the span (the matches are reduced block by block,
not gathered). Two token files (numpy arrays, no tokenizer) repeat one text hundreds of times between noise."""

from __future__ import annotations

import numpy as np
import pytest

from olmo_data.dataset import InstanceSource
from olmo_data.dataset.instances import open_from_config
from olmo_data.errors import DataError
from olmo_data.suffix_index import build_index, open_index
from olmo_data.trace import text_scan
from olmo_data.trace.contamination import search_texts
from olmo_data.trace.spans import find_spans
from olmo_data.trace.text_scan import Places

K = 13
TEXT = list(range(100, 130))  # 30 token ids the noise never holds
COPIES = (300, 500)  # of TEXT in the first and the second file


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> InstanceSource:
    root = tmp_path_factory.mktemp("text-scan-cut")
    rng = np.random.default_rng(11)
    paths = []
    for n, copies in enumerate(COPIES):
        pieces = []
        for _ in range(copies):
            pieces += [rng.integers(500, 2000, size=int(rng.integers(1, 40))), np.array(TEXT)]
        np.concatenate(pieces).astype(np.uint16).tofile(root / f"part-{n}.npy")
        paths.append(str(root / f"part-{n}.npy"))
    cfg = {"global_train_batch_size": 2, "model": {"max_sequence_length": 64}, "data": {"paths": paths}}
    src = open_from_config(cfg)
    build_index(src, shard_tokens=1 << 13, progress=False)
    return src


def queries() -> list[list[int]]:
    return [TEXT, [7, 8, 9, *TEXT[:20], 3, 4, *TEXT[5:25]], [9] * 20]  # one span; two spans; none


def plain(found: list[tuple[int, int, dict[str, np.ndarray], int]]) -> list[tuple[int, int, dict[str, list[int]], int]]:
    return [(i, j, {p: v.tolist() for p, v in at.items() if len(v)}, count) for i, j, at, count in found]


@pytest.mark.parametrize("keep", [0, 7, 300, 450, 1000])
def test_the_scan_cuts_as_the_index_and_the_single_text_scan(
    source: InstanceSource, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    monkeypatch.setattr(text_scan, "_BLOCK", 1 << 10)  # many blocks, each reduced and merged
    monkeypatch.setattr(text_scan, "_COMPACT", 64)
    monkeypatch.setattr("olmo_data.trace.scan.SCAN_CHUNK", 1 << 12)  # many chunks per file
    merged_sizes: list[int] = []
    merged = Places.merged.__func__  # type: ignore[attr-defined]

    def recorded(cls: type[Places], parts: list[Places], keep: int) -> Places:
        out: Places = merged(cls, parts, keep)
        merged_sizes.append(len(out.at))
        return out

    monkeypatch.setattr(Places, "merged", classmethod(recorded))
    by_scan, _ = search_texts(source, queries(), K, search="scan", max_places=keep)
    index = open_index(source)
    assert index is not None
    by_index, _ = search_texts(source, queries(), K, index=index, search="index", max_places=keep)
    alone = [find_spans(source, q, K, max_places=keep)[0] for q in queries()]
    assert [plain(f) for f in by_scan] == [plain(f) for f in by_index] == [plain(f) for f in alone]

    (whole,), (first, second), none = (plain(f) for f in by_scan)
    assert none == [] and whole[3] == first[3] == second[3] == sum(COPIES)  # every place counted
    first_file, second_file = source.files[0].path, source.files[1].path
    listed = {p: len(v) for p, v in whole[2].items()}
    assert listed == {p: n for p, n in ((first_file, min(keep, 300)), (second_file, min(500, max(0, keep - 300)))) if n}
    assert max(merged_sizes) <= 3 * keep  # a span start's places, never all of them: 3 spans' worth at most


def test_the_cut_is_the_same_with_the_files_named_the_other_way(source: InstanceSource) -> None:
    """The run's order of data paths decides which places come first, for the scan and the index alike."""
    cfg = {"global_train_batch_size": 2, "model": {"max_sequence_length": 64}}
    backward = open_from_config(cfg | {"data": {"paths": [f.path for f in source.files][::-1]}})
    by_scan, _ = search_texts(backward, [TEXT], K, search="scan", max_places=10)
    index = open_index(backward)
    assert index is not None
    by_index, _ = search_texts(backward, [TEXT], K, index=index, search="index", max_places=10)
    assert plain(by_scan[0]) == plain(by_index[0])
    assert list(plain(by_scan[0])[0][2]) == [source.files[1].path]  # all 10 from the file listed first


def test_a_negative_cap_is_refused(source: InstanceSource) -> None:
    with pytest.raises(DataError, match=r"^--max-places -1: expected a number of places, 0 or more$"):
        search_texts(source, [TEXT], K, max_places=-1)
