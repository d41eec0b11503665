"""An OLMo-core run over the simulated store (tests/sim_store.py), small: its config.json's work_dir is the
training cluster's folder (absent here), the order is given with `--order URL` and read by ranges, never whole,
or rebuilt when the store has none; `inspect-batch` answers as the store's own computation says (OLMo-core's
order and instances from the generator: file, offset, tokens, documents), without the toolkit's code."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.remote import RemoteReader
from tests import sim_store as sim
from tests.olmo_core_commands import run_json
from tests.sim_store import SimServer, SimSpec

# 2M instances of 8 tokens: an 8 MB order, so that the blocks its opening check samples lie far apart
SPEC = SimSpec(total_tokens=16_000_000, sequence_length=8, instances_per_batch=16, doc_tokens=2000)
PER_EPOCH = sim.dataset_size(SPEC) // SPEC.instances_per_batch


@pytest.fixture
def store(fresh_reader: RemoteReader) -> Iterator[SimServer]:
    with SimServer(SPEC) as server:
        yield server


def config_json(server: SimServer, folder: Path) -> str:
    path = folder / "config.json"
    path.write_text(json.dumps(sim.olmo_core_config(server.spec, server.http_urls())))
    assert not os.path.exists(sim.CLUSTER_WORK_DIR)  # the run's work_dir: the training cluster's, absent here
    return str(path)


def check_batch(got: dict[str, Any], server: SimServer, step: int) -> None:
    """Every instance of the answer is the store's: OLMo-core's order entry, file, offset, tokens, documents."""
    spec, urls = server.spec, server.http_urls()
    want = sim.step_instances(spec, step)
    assert [i["instance"] for i in got["instances"]] == want.tolist()
    assert got["epoch"] == 1 + (step - 1) // PER_EPOCH and got["trainer"] == "olmo-core"
    for inst, k in zip(got["instances"], want.tolist(), strict=True):
        i, offset = sim.instance_location(spec, k)
        assert (inst["path"], inst["token_offset"]) == (urls[i], offset)
        np.testing.assert_array_equal(inst["token_ids"], sim.instance_tokens(spec, k))
        starts, ends = sim.documents(spec, i)
        over = np.flatnonzero((starts < offset + spec.sequence_length) & (ends > offset))
        ids = [sim.document_id(spec, i, int(j)) for j in over] if sim.has_metadata(spec, i) else []
        assert [d["id"] for d in inst["documents"] or []] == ids


def test_inspect_batch_reads_the_order_by_url_in_ranges(store: SimServer, tmp_path: Path) -> None:
    config = config_json(store, tmp_path)
    step = PER_EPOCH - 2  # late in epoch 1, whose order the store holds
    folder = f"{store.base}/orders"
    got = run_json(["inspect-batch", config, "--step", str(step), "--order", folder, "--json"])
    check_batch(got, store, step)
    order_url = f"{folder}/{sim.order_name(SPEC, 1)}"
    assert got["order_note"].startswith(f"read from {order_url}")
    stats = store.stats()
    assert stats["whole_gets"] == {}  # no order, no token file read whole
    assert stats["bytes_by_kind"]["order"] < 0.02 * 4 * sim.dataset_size(SPEC)  # a sample and one batch's slice
    batch_bytes = SPEC.instances_per_batch * SPEC.sequence_length * 4
    assert stats["bytes_by_kind"]["tokens"] <= batch_bytes + SPEC.files * 8192  # and each file's dtype sample
    # the order file itself as --order: the same answer; a step of epoch 2 (none stored) is rebuilt beside it
    assert run_json(["inspect-batch", config, "--step", str(step), "--order", order_url, "--json"]) == got
    later = PER_EPOCH + 5
    again = run_json(["inspect-batch", config, "--step", str(later), "--order", order_url, "--json"])
    check_batch(again, store, later)
    assert again["order_note"].startswith("rebuilt") and "not found" in again["order_note"]


def test_inspect_batch_rebuilds_an_order_the_store_does_not_hold(fresh_reader: RemoteReader, tmp_path: Path) -> None:
    with SimServer(replace(SPEC, with_order=False, total_tokens=400_000)) as server:
        config = config_json(server, tmp_path)
        step = 1234
        got = run_json(["inspect-batch", config, "--step", str(step), "--order", f"{server.base}/orders", "--json"])
        check_batch(got, server, step)
        assert got["order_note"].startswith("rebuilt") and "not found" in got["order_note"]
        assert run_json(["inspect-batch", config, "--step", str(step), "--json"])["instances"] == got["instances"]


def test_an_order_file_of_another_name_is_refused(store: SimServer, tmp_path: Path) -> None:
    config = config_json(store, tmp_path)
    other = f"{store.base}/orders/global_indices_dataset_size7_epoch1_seed{SPEC.order_seed}_v1.npy"
    result = CliRunner().invoke(data_main, ["inspect-batch", config, "--step", "3", "--order", other, "--json"])
    assert result.exit_code != 0
    assert "not one of this run's order files" in result.output and sim.order_name(SPEC, 1) in result.output
