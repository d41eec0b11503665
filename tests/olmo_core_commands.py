"""The data commands on an OLMo-core run, checked against OLMo-core's own loader and dataset (tests only).

`check_commands` runs `olmo-data inspect-batch --json` and `olmo-data trace --json` (the commands, through click)
on the config.json an OLMo-core run saved, and compares them with what OLMo-core's loader yielded (`reference`,
from `tests/olmo_core_reference.drive_loader`) and with OLMo-core's dataset's own reading of each instance (which
file, which tokens), independently of `olmo_data`: at steps in the first, second and last epoch driven, on 2
ranks; and a document's trace with the steps (and ranks) whose OLMo-core batches held its tokens.
"""

from __future__ import annotations

import csv
import functools
import json
from typing import Any

import numpy as np
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.dataset.fingerprint import batch_fingerprint


def core_locate(dataset: Any, index: int) -> tuple[str, int, int]:
    """(path, first token, tokens) of OLMo-core instance `index`, as OLMo-core's own dataset reads it: a padded
    dataset from the instance boundaries it wrote, the others at `local index x sequence_length`."""
    for i, (lo, hi) in enumerate(dataset.offsets):
        if lo <= index < hi:
            path, j = str(dataset.paths[i]), index - lo
            if type(dataset).__name__ == "NumpyPaddedFSLDataset":
                start, end = (int(x) for x in _bounds(dataset, i)[2 * j : 2 * j + 2])
                return path, start, end - start
            return path, j * dataset.sequence_length, dataset.sequence_length
    raise IndexError(index)


_BOUNDS: dict[tuple[int, int], np.ndarray] = {}


def _bounds(dataset: Any, i: int) -> np.ndarray:
    if (id(dataset), i) not in _BOUNDS:
        path = dataset._get_instance_indices_path(dataset.paths[i])
        _BOUNDS[(id(dataset), i)] = np.fromfile(path, dtype=dataset.indices_dtype)
    return _BOUNDS[(id(dataset), i)]


def run_json(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(data_main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def chosen_steps(reference: dict[int, list[Any]]) -> list[int]:
    """The first step of epochs 1 and 2, and the last step driven (in a later epoch)."""
    steps = reference[0]
    firsts = [next(s.step for s in steps if s.epoch == e) for e in (1, 2)]
    return sorted({*firsts, steps[-1].step})


def check_commands(config_json: str, config: Any, reference: dict[int, list[Any]], *, trace: bool = True) -> None:
    """inspect-batch --json instance for instance and trace of a document, against OLMo-core (see the module)."""
    from tests.olmo_core_reference import global_rows

    dataset = config.dataset.build()
    loader = config.data_loader.build(dataset)  # as drive_loader: the loader gives the dataset its work_dir
    first_batch = len(reference[0][0].index) * len(reference)  # instances at step 1 (a schedule's first size)
    check_stats_and_orders(config_json, dataset, loader, max(s.epoch for s in reference[0]), first_batch)
    world = len(reference)
    for step in chosen_steps(reference):
        want_fp = batch_fingerprint(global_rows(reference, step, "input_ids"))
        for rank in range(world):
            theirs = reference[rank][step - 1]
            got = run_json(
                ["inspect-batch", config_json, "--step", str(step), "--rank", str(rank)]
                + ["--world-size", str(world), "--json"]
            )
            assert got["trainer"] == "olmo-core" and got["epoch"] == theirs.epoch, (step, got["epoch"])
            assert got["batch_fingerprint"] == want_fp
            assert got["global_batch_tokens"] == len(theirs.index) * world * config.dataset.sequence_length
            assert [i["instance"] for i in got["instances"]] == theirs.index.tolist()
            for row, inst in enumerate(got["instances"]):
                np.testing.assert_array_equal(inst["token_ids"], theirs.input_ids[row])
                if theirs.label_mask is not None:
                    np.testing.assert_array_equal(inst["label_mask"], theirs.label_mask[row])
                if theirs.instance_mask is not None:
                    assert inst["masked"] == (not theirs.instance_mask[row])
                path, start, length = core_locate(dataset, int(theirs.index[row]))
                assert (inst["path"], inst["token_offset"]) == (path, start)
                check_documents(inst["documents"], path, start, length)
    if trace:
        check_trace(config_json, dataset, reference)


@functools.lru_cache(maxsize=256)
def metadata_rows(path: str) -> list[tuple[int, int, str]]:
    """(start, end, id) of each document of a token file, read straight from its tokenize metadata."""
    from olmo_data.io import open_file

    meta = path[: -len(".npy")] + ".csv.gz"
    with open_file(meta, "rt") as f:
        return [(int(r[0]), int(r[1]), r[2]) for r in csv.reader(f)]


def check_documents(documents: list[dict[str, Any]], path: str, start: int, length: int) -> None:
    """The documents of an instance are those of the metadata rows over its tokens, tiling them in order."""
    rows = [r for r in metadata_rows(path) if r[0] < start + length and r[1] > start]
    assert [d["id"] for d in documents] == [r[2] for r in rows]
    assert documents[0]["instance_start"] == 0 and documents[-1]["instance_end"] == length
    for a, b in zip(documents, documents[1:], strict=False):
        assert a["instance_end"] == b["instance_start"]


def check_trace(config_json: str, dataset: Any, reference: dict[int, list[Any]]) -> None:
    """A document held by the last step's batch: trace names exactly the (step, rank) pairs whose OLMo-core
    batches held one of the instances OLMo-core's dataset cuts from its tokens."""
    last = reference[0][-1]
    path, start, length = core_locate(dataset, int(last.index[-1]))
    _, _, doc_id = next(r for r in metadata_rows(path) if r[0] < start + length and r[1] > start)
    holding = set()
    for index in range(len(dataset)):
        p, s, n = core_locate(dataset, index)
        if any(doc == doc_id and a < s + n and b > s for a, b, doc in metadata_rows(p)):
            holding.add(index)
    want = sorted({(s.step, r) for r, steps in reference.items() for s in steps if holding & set(s.index.tolist())})
    world = len(reference)
    got = run_json(
        ["trace", config_json, "--document", doc_id, "--steps", f"1..{last.step}"]
        + ["--world-size", str(world), "--json"]
    )
    assert sorted({(h["step"], h["rank"]) for h in got["hits"]}) == want and want
    assert {h["instance"] for h in got["hits"]} <= holding


def check_stats_and_orders(config_json: str, dataset: Any, loader: Any, epochs: int, first_batch: int) -> None:
    """`stats --json`: OLMo-core's dataset size and batches per epoch, its batch size in tokens, its order files
    found; `build-order`: each epoch's file under OLMo-core's name with OLMo-core's bytes (those its loader wrote
    in the work_dir), and the work_dir's own files recognised as identical and kept."""
    import os
    import tempfile
    from pathlib import Path

    stats = run_json(["stats", config_json, "--json"])
    assert stats["num_instances"] == len(dataset) and stats["trainer"] == "olmo-core"
    assert stats["global_batch_tokens"] == first_batch * dataset.sequence_length
    assert stats["batches_per_epoch"] == len(dataset) // first_batch
    assert all(note.startswith("read from") for note in stats["orders"][:epochs])  # those the loader drove
    work_dir = str(loader.work_dir)
    written = sorted(f for f in os.listdir(work_dir) if f.startswith("global_indices"))
    assert len(written) == epochs, written
    with tempfile.TemporaryDirectory() as other:
        result = CliRunner().invoke(
            data_main, ["build-order", config_json, "--epochs", str(epochs), "--destination", other]
        )
        assert result.exit_code == 0, result.output
        assert sorted(os.listdir(other)) == written
        for name in written:
            assert Path(other, name).read_bytes() == Path(work_dir, name).read_bytes(), name
    result = CliRunner().invoke(data_main, ["build-order", config_json, "--epochs", str(epochs)])
    assert result.exit_code == 0 and result.output.count("identical to OLMo-core's order (kept)") == epochs
