"""An OLMo-form YAML (allenai/OLMo's TrainConfig: `data.paths` the token file URLs, `data.memmap_dtype: uint32`)
over the simulated store's files (tests/sim_store.py), small. OLMo keeps its order in `save_folder/train_data`
(`global_indices.npy`, epoch 0), here the training cluster's folder, absent: the order is given with `--order`
(the store's copy, by URL, read by ranges), or built locally with `build-order --destination`. The answers of
`inspect-batch` and `trace --document` are checked against OLMo's rule computed here with numpy (epoch e's order
is `np.arange(N, dtype=uint32)` shuffled by PCG64(seed + e), epochs from 0, step s trains batch s - 1 of
`global_train_batch_size` instances, an epoch's tail that does not fill a batch dropped) and against the
generator's files, offsets, tokens and documents, without the toolkit's code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.config.olmo import olmo_form_key
from olmo_data.remote import RemoteReader
from tests import sim_store as sim
from tests.olmo_core_commands import run_json
from tests.sim_store import SimServer, SimSpec

# 250,000 instances of 8 tokens (a 1 MB order); the YAML's seed other than OLMo-core's epoch-1 seed (the store's
# default), so that its order is a permutation of its own
SPEC = SimSpec(total_tokens=2_000_000, sequence_length=8, instances_per_batch=16, doc_tokens=200, olmo_seed=7)
N = sim.dataset_size(SPEC)
GBS = SPEC.instances_per_batch
PER_EPOCH = N // GBS


def olmo_order(seed: int, epoch: int) -> np.ndarray:
    """OLMo's order of `epoch` (0-based), as its IterableDataset builds global_indices.npy."""
    order = np.arange(N, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(order)
    return order


ORDER = olmo_order(SPEC.olmo_seed, 0)


@pytest.fixture
def store(fresh_reader: RemoteReader) -> Iterator[SimServer]:
    with SimServer(SPEC) as server:
        yield server


def olmo_yaml(server: SimServer, folder: Path) -> str:
    path = sim.write_olmo_yaml(server.spec, server.http_urls(), folder / "OLMo-7B-sim.yaml")
    raw = yaml.safe_load(path.read_text())
    assert olmo_form_key(raw) is not None and raw["data"]["memmap_dtype"] == "uint32"
    assert not Path(raw["save_folder"]).exists()  # the training cluster's folder
    return str(path)


def placed(instance: int) -> tuple[int, int]:
    """(file, first token) of an instance: OLMo's MemMapDataset cuts each file into tokens // L instances."""
    bounds = np.cumsum(sim.token_counts(SPEC) // SPEC.sequence_length)
    i = int(np.searchsorted(bounds, instance, side="right"))
    return i, (instance - (int(bounds[i - 1]) if i else 0)) * SPEC.sequence_length


def check_batch(got: dict[str, Any], urls: list[str], step: int) -> None:
    batch = step - 1
    assert (got["epoch"], got["batch_in_epoch"], got["seed"]) == (batch // PER_EPOCH, batch % PER_EPOCH, SPEC.olmo_seed)
    assert got["num_instances"] == N and got["global_batch_size"] == GBS
    b = batch % PER_EPOCH
    want = ORDER[b * GBS : (b + 1) * GBS].tolist()
    assert [i["instance"] for i in got["instances"]] == want
    L = SPEC.sequence_length
    for inst, k in zip(got["instances"], want, strict=True):
        i, offset = placed(k)
        assert (inst["path"], inst["token_offset"]) == (urls[i], offset)
        np.testing.assert_array_equal(inst["token_ids"], sim.tokens(SPEC, i, offset, offset + L))
        starts, ends = sim.documents(SPEC, i)
        over = np.flatnonzero((starts < offset + L) & (ends > offset))
        ids = [sim.document_id(SPEC, i, int(j)) for j in over] if sim.has_metadata(SPEC, i) else []
        assert [d["id"] for d in inst["documents"] or []] == ids


def test_the_store_serves_olmos_order_beside_olmo_cores() -> None:
    size = sim.object_size(SPEC, sim.OLMO_ORDER_KEY)
    assert size == 4 * N
    stored = np.frombuffer(sim.object_bytes(SPEC, sim.OLMO_ORDER_KEY, 0, 4 * N), dtype="<u4")
    np.testing.assert_array_equal(stored, ORDER)
    # by default the YAML's seed is OLMo-core's epoch-1 seed: one permutation, the same instances at every step
    default = SimSpec()
    assert default.olmo_seed == default.order_seed + 1
    np.testing.assert_array_equal(sim.olmo_step_instances(default, 5), sim.step_instances(default, 5))
    assert sim.OLMO_ORDER_KEY not in sim.object_keys(replace(SPEC, with_order=False))


def test_inspect_batch_of_the_olmo_yaml_reads_the_order_by_url(store: SimServer, tmp_path: Path) -> None:
    config, urls = olmo_yaml(store, tmp_path), store.http_urls()
    folder = f"{store.base}/olmo/train_data"  # the copy of save_folder/train_data
    for step in (1, PER_EPOCH - 3):
        store.reset()
        got = run_json(["inspect-batch", config, "--step", str(step), "--order", folder, "--json"])
        check_batch(got, urls, step)
        assert got["order_path"] == f"{folder}/global_indices.npy"
        stats = store.stats()
        assert stats["whole_gets"] == {}  # neither the order nor any token file read whole
        assert stats["bytes_by_kind"]["order"] == 4 * GBS  # one batch's slice
    file_url = f"{folder}/global_indices.npy"
    assert run_json(["inspect-batch", config, "--step", str(step), "--order", file_url, "--json"]) == got
    assert sim.olmo_step_instances(SPEC, step).tolist() == [i["instance"] for i in got["instances"]]


def test_an_absent_order_is_named_then_built_locally(store: SimServer, tmp_path: Path) -> None:
    config, step = olmo_yaml(store, tmp_path), 1234
    result = CliRunner().invoke(data_main, ["inspect-batch", config, "--step", str(step), "--json"])
    assert result.exit_code != 0
    assert "global_indices.npy: order file not found" in result.output and "build-order" in result.output
    orders = tmp_path / "orders"
    built = CliRunner().invoke(data_main, ["build-order", config, "--destination", str(orders)])
    assert built.exit_code == 0, built.output
    np.testing.assert_array_equal(np.fromfile(orders / "global_indices.npy", dtype="<u4"), ORDER)
    got = run_json(["inspect-batch", config, "--step", str(step), "--order", str(orders), "--json"])
    check_batch(got, store.http_urls(), step)


def test_trace_of_a_document_of_the_olmo_yaml(store: SimServer, tmp_path: Path) -> None:
    config, L = olmo_yaml(store, tmp_path), SPEC.sequence_length
    i = next(i for i in range(SPEC.files - 2, 0, -1) if sim.has_metadata(SPEC, i))
    j = sim.document_count(SPEC, i) // 2
    start, end = (int(x[0]) for x in sim.document_bounds(SPEC, i, np.array([j])))
    first = int(np.sum(sim.token_counts(SPEC)[:i] // L))  # the file's first instance
    held = range(start // L, (end - 1) // L + 1)
    want = []
    for k in held:
        g = first + k
        p = int(np.flatnonzero(ORDER == g)[0])
        if p < PER_EPOCH * GBS:  # one epoch (max_duration: 1ep), its tail dropped
            lo, hi = max(start, k * L), min(end, (k + 1) * L)
            want.append((p // GBS + 1, p % GBS, g, lo - k * L, hi - k * L, lo - start, hi - start))
    got = run_json(
        ["trace", config, "--document", sim.document_id(SPEC, i, j), "--order", f"{store.base}/olmo/train_data"]
        + ["--json"]
    )
    assert [(t["file_index"], t["start"], t["end"]) for t in got["targets"]] == [(i, start, end)]
    assert (got["first_step"], got["last_step"]) == (1, PER_EPOCH)
    keys = ("step", "position", "instance", "instance_start", "instance_end", "target_start", "target_end")
    assert sorted(tuple(h[k] for k in keys) for h in got["hits"]) == sorted(want)
    assert len(want) >= 2


def test_the_trace_reads_the_order_in_blocks_with_the_same_hits(
    store: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch's order searched (and checked) a few thousand entries at a time finds the same steps; a second
    call finds the order's verdict kept and only searches."""
    import olmo_data.dataset.order_checks as order_checks

    monkeypatch.setattr(order_checks, "SCAN_ENTRIES", 4_099)
    test_trace_of_a_document_of_the_olmo_yaml(store, tmp_path)
    checks = list(Path(os.environ["OLMO_DATA_CACHE"], "order-checks").iterdir())
    assert checks
    test_trace_of_a_document_of_the_olmo_yaml(store, tmp_path)
