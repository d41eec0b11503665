"""Our suffix index against infini-gram 2.6.0 (the reference OLMoTrace runs on), over the same token files: every
count, every position, the longest match at every start of a text and the maximal spans agree. infini-gram is in
the `dev` extra; where its wheel cannot install (a platform without one) the test skips, saying so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.instances import open_from_config
from olmo_data.suffix_index import build_index, open_index
from olmo_data.trace.spans import find_spans
from tests.infini_gram_reference import Reference, build_reference, have_infini_gram

pytestmark = pytest.mark.skipif(
    not have_infini_gram(), reason="infini-gram is not installed (pip install infini-gram==2.6.0: the dev extra)"
)


def token_files(tmp_path: Path, dtype: str) -> list[str]:
    """Three files of a small alphabet (many repeats of every length), with long copies inside and across files,
    one short file, and ids near the dtype's top."""
    rng = np.random.default_rng(11)
    top = 60_000 if dtype == "uint16" else 4_000_000_000  # near the top of the dtype, below the separator
    values = np.array([1, 2, 3, 5, 8, 13, top - 1, top - 2], dtype=np.int64)
    arrays = [values[rng.integers(0, len(values), n)] for n in (2500, 1800, 40)]
    arrays[0][2000:2120] = arrays[0][100:220]
    arrays[1][-60:] = arrays[0][300:360]
    arrays[2][:] = arrays[1][500:540]
    paths = []
    for k, a in enumerate(arrays):
        paths.append(str(tmp_path / f"part-{k}.npy"))
        a.astype(dtype).tofile(paths[-1])
    return paths


def test_counts_positions_longest_matches_and_spans_agree_with_infini_gram(tmp_path: Path) -> None:
    # uint16 only: infini-gram's suffix sort of 4-byte tokens allocates 32 GiB whatever the data's size (measured:
    # "memory allocation of 34359738368 bytes failed"); ours on uint32 is checked against the scan elsewhere
    dtype = "uint16"
    paths = token_files(tmp_path, dtype)
    source = open_from_config({"model": {"max_sequence_length": 16}, "data": {"paths": paths, "dtype": dtype}})
    build_index(source, shard_tokens=900, context=11, progress=False)  # shard ends and passages past the context
    ours = open_index(source)
    assert ours is not None
    build_reference(paths, dtype, tmp_path / "infini-gram")
    reference = Reference(tmp_path / "infini-gram", paths, dtype)
    files = [np.fromfile(p, dtype=dtype).astype(np.int64) for p in paths]

    rng = np.random.default_rng(0)
    found = 0
    for trial in range(120):
        f = int(rng.integers(0, 2))
        n = int(rng.choice([1, 2, 3, 4, 6, 10, 30, 79]))
        at = int(rng.integers(0, len(files[f]) - n))
        query = files[f][at : at + n].tolist()
        if trial % 4 == 0:
            query[-1] = 4  # held nowhere
        assert ours.count(query) == reference.count(query), query
        got = {p: v.tolist() for p, v in ours.find(query).items()}
        assert got == reference.find(query), query
        found += sum(len(v) for v in got.values())
    assert found > 1000  # counts in the hundreds for short n-grams, one for long ones

    for _ in range(8):  # texts of pieces of the data and of tokens it never holds in that order
        a, b = int(rng.integers(0, 2300)), int(rng.integers(0, 1700))
        query = [*files[0][a : a + 40].tolist(), 4, 4, *files[1][b : b + 30].tolist(), 13, 13, 13, 13, 13]
        starts = np.arange(len(query))
        assert ours.longest(query, starts).tolist() == reference.longest(query)
        spans, _ = find_spans(source, query, 6, index=ours, max_places=10**6)
        expected = reference.spans(query, 6)
        assert [{"start": i, "end": j, "count": c} for i, j, _, c in spans] == expected
        assert len(expected) >= 2
        for i, j, places, _ in spans:
            assert {p: v.tolist() for p, v in places.items()} == reference.find(query[i:j])
