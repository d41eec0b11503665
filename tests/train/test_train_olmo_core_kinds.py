"""Our trainer on OLMo-core's other dataset classes (`data.olmo_core`), against OLMo-core 3.0.0 itself: its config
classes write the run's config.json, its NumpyFSLDataLoader yields the reference batches (tests/olmo_core_reference.py),
and a tiny model of ours training 3 steps on that config.json must log the fingerprints of OLMo-core's input_ids
and train exactly OLMo-core's label-masked tokens. (Packed data: tests/train/test_train_olmo_core_packed.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.run import ROW
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
        mask = step.label_mask if step.label_mask is not None else np.ones(step.input_ids.shape, dtype=bool)
        assert m["train/supervised_tokens"] == int(mask[:, 1:].sum())


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


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_trains_on_vsl_batches(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nproc: int) -> None:
    """A NumpyVSLDataset run (natural curriculum): each step one bucket's rows, of its own length, the batch in
    tokens the same; on 2 processes each rank trains its block of the batch as OLMo-core's VSL loader splits it,
    and the losses and each position's record equal one process's."""
    from tests.data.olmo_core import test_olmo_core_vsl as vsl

    paths = vsl.token_files(tmp_path / "tokens", seed=5)
    config = vsl.vsl_config(core, tmp_path, paths, vsl.curriculum_config("natural"), 8 * vsl.MAX, num_threads=0)
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    reference = core.drive_loader(config, world_size=1, last_step=STEPS, monkeypatch=monkeypatch)[0]
    want = [batch_fingerprint(s.input_ids) for s in reference]
    assert len({s.input_ids.shape[1] for s in reference}) > 1  # steps of different lengths
    launch(ours(tmp_path, config_json, max_sequence_length=vsl.MAX), nproc)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/batch_fingerprint"] for m in metrics] == want
    for m, step in zip(metrics, reference, strict=True):
        rows, length = step.input_ids.shape
        assert m["train/supervised_tokens"] == rows * (length - 1) and m["train/tokens_seen"] == m["step"] * 8 * vsl.MAX
    if nproc > 1:  # the same losses as one process: each rank trained its own block, together the whole batch
        one = tmp_path / "one"
        one.mkdir()
        launch(ours(one, config_json, max_sequence_length=vsl.MAX), 1)
        alone = [json.loads(line) for line in (one / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [m["train/loss"] for m in metrics] == pytest.approx([m["train/loss"] for m in alone], rel=1e-4)
        first = [np.fromfile(f / "run" / "instance_loss.bin", dtype=ROW) for f in (tmp_path, one)]
        both = [r[r["step"] == 1]["loss_sum"] for r in first]  # each position's loss at the initial weights
        assert both[0] == pytest.approx(both[1], rel=1e-4) and len(set(both[1].round(3).tolist())) > 1
    losses = np.fromfile(tmp_path / "run" / "instance_loss.bin", dtype=ROW)
    for step in range(1, STEPS + 1):  # the per-instance record in batch order: each row's targets
        rows = losses[losses["step"] == step]
        assert rows["tokens"].tolist() == [reference[step - 1].input_ids.shape[1] - 1] * len(rows)


def test_trains_on_a_source_mixture(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NumpyFSLDataset from a SourceMixtureDatasetConfig (token budgets, a source repeated): OLMo-core's batches,
    each instance under its mixture source."""
    from olmo_core.data import NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList

    paths = token_files(tmp_path / "tokens", seed=9)
    sources = SourceMixtureList(
        sources=[
            SourceMixtureConfig(source_name="web", target_ratio=0.6, paths=paths[:3]),
            SourceMixtureConfig(source_name="code", target_ratio=0.4, paths=[paths[3]], max_repetition_ratio=3.0),
        ]
    )
    mixture = SourceMixtureDatasetConfig(
        source_list=sources, requested_tokens=PER_BATCH * L * 6, global_batch_size=PER_BATCH * L, seed=11, quiet=True
    )
    tokenizer = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)
    dataset = NumpyFSLDatasetConfig.from_src_mix(mixture, tokenizer=tokenizer, sequence_length=L)
    check_trains_their_batches(core, tmp_path, monkeypatch, dataset)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {k.split("/")[2] for m in metrics for k in m if k.startswith("train/source/")} == {"web", "code"}
