"""The simulated store's document indexes (tests/sim_doc_index.py): each is the file `olmo-data index-documents`
builds from the metadata it stands beside (but for the metadata's sha256, zeros there), any byte range is the
slice of the whole, and with them `inspect-batch` and `trace --document` find documents by ranged reads of the
indexes, never reading a metadata file, with the answers the whole metadata gives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.doc_index_file import encode_index, parse_head, read_metadata
from olmo_data.remote import RemoteReader
from tests import sim_doc_index
from tests import sim_store as sim
from tests.data.remote.test_sim_run import PER_EPOCH, check_batch
from tests.data.remote.test_sim_run import SPEC as RUN_SPEC
from tests.olmo_core_commands import run_json
from tests.sim_store import SimServer, SimSpec

SPEC = SimSpec(doc_index=True, total_tokens=3_000_000, doc_tokens=40)  # ~3,000 documents a file: several blocks


def whole(spec: SimSpec, key: str) -> bytes:
    size = sim.object_size(spec, key)
    assert size is not None, key
    return sim.object_bytes(spec, key, 0, size)


def test_the_served_index_is_what_index_documents_builds_from_the_metadata(tmp_path: Path) -> None:
    files = [i for i in range(SPEC.files) if sim.has_metadata(SPEC, i)]
    assert len(files) < SPEC.files and f"tokens/part-{files[0]:05d}.docs.idx" in sim.object_keys(SPEC)
    largest = max(files, key=lambda i: sim.document_count(SPEC, i))
    assert sim.document_count(SPEC, largest) > 3 * 1024  # several blocks of rows, of hashes and of samples
    for i in [*files[:4], largest, files[-1]]:
        meta = tmp_path / f"part-{i:05d}.csv.gz"
        meta.write_bytes(whole(SPEC, f"tokens/part-{i:05d}.csv.gz"))
        columns = replace(read_metadata(str(meta), tmp_path), sha256="00" * 32)
        built = b"".join(encode_index(columns, str(meta)))
        served = whole(SPEC, f"tokens/part-{i:05d}.docs.idx")
        assert served == built, i
        head = parse_head(served, "served")
        assert head.documents == sim.document_count(SPEC, i) and head.metadata_size == meta.stat().st_size
    absent = next(i for i in range(SPEC.files) if not sim.has_metadata(SPEC, i))
    assert sim.object_size(SPEC, f"tokens/part-{absent:05d}.docs.idx") is None
    assert sim.object_size(replace(SPEC, doc_index=False), f"tokens/part-{files[0]:05d}.docs.idx") is None


def test_any_byte_range_of_an_index_is_the_slice_of_the_whole() -> None:
    rng = np.random.default_rng(1)
    key = f"tokens/part-{next(i for i in range(2, SPEC.files) if sim.has_metadata(SPEC, i)):05d}.docs.idx"
    data = whole(SPEC, key)
    for _ in range(300):
        a = int(rng.integers(0, len(data)))
        b = int(rng.integers(a, min(len(data), a + int(rng.choice([40, 5_000, 200_000]))) + 1))
        assert sim.object_bytes(SPEC, key, a, b) == data[a:b], (a, b)


def test_the_hashes_kept_in_a_cache_folder_are_mapped_again(tmp_path: Path) -> None:
    i = next(i for i in range(SPEC.files) if sim.has_metadata(SPEC, i))
    first = sim_doc_index.DocIndexes(SPEC, tmp_path)
    assert first.prepare(processes=2) == sum(sim.has_metadata(SPEC, k) for k in range(SPEC.files))
    again = sim_doc_index.DocIndexes(SPEC, tmp_path)
    assert again.prepare() == 0  # all there
    samples = sorted(tmp_path.rglob("*.sample.npy"))  # (each head's sample, a file of its own)
    assert len(samples) == sum(sim.has_metadata(SPEC, k) for k in range(SPEC.files))
    samples[0].unlink()
    assert sim_doc_index.DocIndexes(SPEC, tmp_path).prepare() == 1  # only that one's sample made again
    hashes, lengths = again.get(i)
    assert isinstance(hashes, np.memmap)
    key = f"tokens/part-{i:05d}.docs.idx"
    assert sim.object_bytes(SPEC, key, 0, 10**9, indexes=again) == whole(SPEC, key)


@pytest.fixture
def indexed(fresh_reader: RemoteReader) -> Iterator[SimServer]:
    with SimServer(replace(RUN_SPEC, doc_index=True, doc_tokens=100)) as server:  # ~7,000 documents a file
        yield server


def _config(server: SimServer, folder: Path) -> str:
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(sim.olmo_core_config(server.spec, server.http_urls())))
    return str(path)


def test_inspect_and_trace_find_documents_by_ranges_of_the_indexes(
    indexed: SimServer, tmp_path: Path, fresh_reader: RemoteReader
) -> None:
    config, spec = _config(indexed, tmp_path), indexed.spec
    step = PER_EPOCH // 2
    got = run_json(["inspect-batch", config, "--step", str(step), "--order", f"{indexed.base}/orders", "--json"])
    check_batch(got, indexed, step)
    assert sum(len(i["documents"] or []) for i in got["instances"]) > 0
    stats = indexed.stats()
    assert "metadata" not in stats["gets_by_kind"] and stats["whole_gets"] == {}
    assert stats["gets_by_kind"]["docindex"] > 0
    assert stats["bytes_by_kind"]["docindex"] < 0.1 * sum(
        sim.object_size(spec, k, indexed.indexes) or 0 for k in sim.object_keys(spec) if k.endswith(".docs.idx")
    )
    i = next(i for i in range(spec.files - 2, 0, -1) if sim.has_metadata(spec, i))
    doc = sim.document_id(spec, i, sim.document_count(spec, i) // 2)
    order = ["--order", f"{indexed.base}/orders"]
    indexed.reset()
    traced = run_json(["trace", config, "--document", doc, *order, "--json"])
    stats = indexed.stats()
    assert "metadata" not in stats["gets_by_kind"] and stats["whole_gets"] == {}
    indexed.reset()  # again: the id's rows come from the answers cache, no block of hashes is read
    assert run_json(["trace", config, "--document", doc, *order, "--json"]) == traced
    assert indexed.stats()["gets_by_kind"].get("docindex", 0) <= 4  # (the found document's rows and id)
    with SimServer(replace(spec, doc_index=False)) as plain:  # no index: documents from the whole metadata
        want = run_json(["trace", _config(plain, tmp_path / "plain"), "--document", doc, "--order",
                         f"{plain.base}/orders", "--json"])  # fmt: skip
        assert plain.stats()["gets_by_kind"]["metadata"] > 0
    start, end = (int(x[0]) for x in sim.document_bounds(spec, i, np.array([sim.document_count(spec, i) // 2])))
    assert [(t["file_index"], t["start"], t["end"]) for t in traced["targets"]] == [(i, start, end)]

    def unplaced(hits: list[dict[str, object]]) -> list[dict[str, object]]:  # (the two stores' ports differ)
        return [{k: v for k, v in h.items() if k != "path"} for h in hits]

    assert unplaced(traced["hits"]) == unplaced(want["hits"]) and len(traced["hits"]) >= 1
