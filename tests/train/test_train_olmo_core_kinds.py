"""Our trainer on OLMo-core's other dataset classes (`data.olmo_core`), against OLMo-core 3.0.0 itself: its config
classes write the run's config.json, its NumpyFSLDataLoader yields the reference batches (tests/olmo_core_reference.py),
and a tiny model of ours training 3 steps on that config.json must log the fingerprints of OLMo-core's input_ids
and train exactly OLMo-core's label-masked tokens. (Packed data: tests/train/test_train_olmo_core_packed.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from olmo_data.dataset.fingerprint import batch_fingerprint
from tests.data.olmo_core.test_olmo_core_interleaved import EOS, PAD, VOCAB, L, token_files
from tests.train.test_train_e2e import launch
from tests.train.test_train_olmo_core_packed import ours

SEED, STEPS, PER_BATCH = 4242, 3, 8


def check_trains_their_batches(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dataset: Any) -> None:
    config = core.experiment_config(
        dataset,
        global_batch_size=PER_BATCH * L,
        seed=SEED,
        work_dir=str(tmp_path / "work"),
        save_folder=str(tmp_path / "x"),
    )
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    reference = core.drive_loader(config, world_size=1, last_step=STEPS, monkeypatch=monkeypatch)[0]
    want = [batch_fingerprint(s.input_ids) for s in reference]
    assert len(set(want)) == STEPS
    launch(ours(tmp_path, config_json), 1)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/batch_fingerprint"] for m in metrics] == want
    for m, step in zip(metrics, reference, strict=True):  # OLMo-core's label masks: exactly its targets trained
        assert m["train/supervised_tokens"] == int(step.label_mask[:, 1:].sum())


def test_trains_on_interleaved_batches(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from olmo_core.data import NumpyInterleavedFSLDatasetConfig, TokenizerConfig

    paths = token_files(tmp_path / "tokens", seed=3)
    dataset = NumpyInterleavedFSLDatasetConfig(
        tokenizer=TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD),
        paths=paths,
        sequence_length=L,
        docs_per_instance=2,
        chunks_per_doc=4,
        seed=77,
    )
    check_trains_their_batches(core, tmp_path, monkeypatch, dataset)


def test_trains_on_composable_batches(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sources concatenated-and-chunked under ComposableDataLoader (its default shuffle): OLMo-core's global
    batches (its 2 ranks' rows put back in batch order) are what ours trains, each instance under its loader
    source."""
    from tests.data.olmo_core import test_olmo_core_composable as comp

    paths = comp.token_files(tmp_path / "tokens", n_files=4)
    dataset = [
        comp.chunked([comp.numpy_source(paths[:2])], label="web"),
        comp.chunked([comp.numpy_source(paths[2:])], label="code"),
    ]
    config_json, reference = comp.run(core, tmp_path, dataset, monkeypatch)
    want = [batch_fingerprint(comp.global_rows(reference, step, "input_ids")) for step in range(1, STEPS + 1)]
    launch(ours(tmp_path, config_json, max_sequence_length=comp.L), 1)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/batch_fingerprint"] for m in metrics] == want
    sources = {k.split("/")[2] for m in metrics for k in m if k.startswith("train/source/")}
    assert sources == {"web", "code"}
