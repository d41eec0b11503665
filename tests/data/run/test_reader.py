"""One reader of a run (olmo_data.run.read_run): the implementation chosen from the config's form, and what the
commands now get for OLMo-core runs through it (trace --spans), checked against an independent computation of
OLMo-core's order (PCG64(seed + epoch) over the instances, epochs from 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from olmo_data.errors import DataError
from olmo_data.olmo_core import build_olmo_core_order
from olmo_data.run import RunData, read_run
from olmo_data.run.reader_olmo import OlmoRun
from olmo_data.run.reader_olmo_core import OlmoCoreRun
from olmo_data.trace import trace_spans
from tests.data.olmo_core.test_olmo_core_commands import L, core_config


def ours_config(tmp_path: Path, **data: object) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    tokens = tmp_path / "ours.npy"
    (np.arange(40 * L, dtype=np.uint16) % 97 + 2).tofile(tokens)
    config = {
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 2048, "max_sequence_length": L},
        "data": data or {"paths": [str(tokens)]},
        "global_train_batch_size": 8,
        "max_duration": 10,
        "save_folder": str(tmp_path / "run"),
    }
    path = tmp_path / "ours.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_reader_is_chosen_from_the_configs_form(tmp_path: Path) -> None:
    core = core_config(tmp_path)
    assert isinstance(read_run(core), OlmoCoreRun) and read_run(core).own is None
    ours = read_run(ours_config(tmp_path))
    assert len(list(ours.build_orders(epochs=2, first_epoch=None, destination=None))) == 2
    assert isinstance(ours, OlmoRun) and ours.own is not None
    trained_on = read_run(ours_config(tmp_path / "on", olmo_core=core))
    assert isinstance(trained_on, OlmoCoreRun) and trained_on.own is not None
    assert trained_on.run_steps() == 10  # our max_duration, in OLMo-core's batches
    for run in (read_run(core), ours, trained_on):
        assert isinstance(run, RunData)
        batch = run.batch(6)
        assert batch.tokens.shape == (8, L) and len(run.place(batch.instances)) == 8


def test_both_readers_give_the_same_batch_arithmetic_each_in_its_own_counting(tmp_path: Path) -> None:
    """The same 40 instances and batch of 8: OLMo-core counts step 6 as epoch 2 (from 1), ours as epoch 1."""
    core, ours = read_run(core_config(tmp_path)), read_run(ours_config(tmp_path))
    list(ours.build_orders(epochs=2, first_epoch=None, destination=None))
    b_core, b_ours = core.batch(6), ours.batch(6)
    assert (b_core.epoch, b_core.batch_in_epoch) == (2, 0) and (b_ours.epoch, b_ours.batch_in_epoch) == (1, 0)
    assert b_core.instances.tolist() == build_olmo_core_order(40, 7, 2)[:8].tolist()
    assert core.batch_note(b_core) is not None and ours.batch_note(b_ours) is None


def test_spans_of_an_olmo_core_run_name_the_steps_of_its_order(tmp_path: Path, demo_tokenizer: str) -> None:
    """A 15-token span of the file (ids repeat every 97 tokens, so it is at 5 + 97k): each place's steps are those
    whose OLMo-core batch held an instance overlapping it, over both epochs of the run."""
    config = core_config(tmp_path)
    file_tokens = np.fromfile(tmp_path / "a.npy", dtype=np.uint16)
    query = file_tokens[5:20].tolist()
    report = trace_spans(config, tokens=query, tokenizer=demo_tokenizer, min_tokens=8, use_index=False)
    assert len(report.spans) == 1 and report.spans[0].end - report.spans[0].start == 15
    starts = [p for p in range(0, len(file_tokens) - 14) if file_tokens[p : p + 15].tolist() == query]
    assert [place.start for place in report.spans[0].places] == starts
    position = {e: {int(i): k for k, i in enumerate(build_olmo_core_order(40, 7, e))} for e in (1, 2)}
    for place in report.spans[0].places:
        instances = range(place.start // L, (place.end - 1) // L + 1)
        want = sorted((e - 1) * 5 + position[e][i] // 8 + 1 for e in (1, 2) for i in instances)
        assert place.steps == sorted(set(want))


def test_a_run_without_a_duration_needs_steps(tmp_path: Path) -> None:
    config = json.loads(Path(core_config(tmp_path)).read_text())
    del config["trainer"]
    path = tmp_path / "no-duration.json"
    path.write_text(json.dumps(config))
    with pytest.raises(DataError, match=r"gives no max_duration.*pass --steps A\.\.B"):
        from olmo_data.trace import trace_chain

        trace_chain(str(path), tokens="5,6,7")
