"""Our trainer on an OLMo-core NumpyPackedFSLDataset run (`data.olmo_core`), against OLMo-core 3.0.0 itself.

OLMo-core's config classes write the run's config.json and its NumpyFSLDataLoader yields the reference batches
(tests/olmo_core_reference.py), with their `doc_lens`. A tiny model of ours trains 3 steps on that config.json:
it must log the fingerprints of OLMo-core's input_ids, count each packed instance under the file of its first
document (as OLMo-core's own packing files place it), and with model.document_masking its loss must be the one
of a boolean block-diagonal mask built here from OLMo-core's doc_lens (and not the unmasked one). The refusals run
without OLMo-core.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from olmo_data.config import ConfigError, load_config
from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_train.distributed import Dist
from olmo_train.nn.model import Transformer
from olmo_train.train.data import TrainData, labels_for
from olmo_train.train.loop import forward_instance_losses
from olmo_train.train.olmo_core_data import doc_starts, open_olmo_core_data
from tests.data.olmo_core.test_olmo_core_packed import EOS, VOCAB, L, minimal, packed, token_files
from tests.train.test_train_e2e import launch

SEED, STEPS, PER_BATCH = 6198, 3, 8
SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def ours(tmp_path: Path, config_json: str, **model: Any) -> Path:
    """A tiny config of ours that trains on the OLMo-core run's batches (the boolean mask path: CPU)."""
    cfg: dict[str, Any] = {
        "run_name": "on-olmo-core-packed",
        "seed": 1,
        "save_folder": str(tmp_path / "run"),
        "max_duration": STEPS,
        "device_train_microbatch_size": 2,
        "save_interval": 100,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "vocab_size": VOCAB, "max_sequence_length": L} | model,
        "optimizer": {"learning_rate": 0.01},
        "data": {"olmo_core": config_json, "prefetch_batches": 1},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def packed_run(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **dataset: Any) -> tuple[str, Any, Any]:
    """OLMo-core's packed run over 4 seeded files in source groups of 2 (config.json, config, rank 0's batches
    of steps 1..STEPS)."""
    paths = token_files(tmp_path / "tokens", n_files=4, seed=11)
    ds = packed(core, paths, source_group_size=2, **({"generate_doc_lengths": True} | dataset))
    config = core.experiment_config(
        ds,
        global_batch_size=PER_BATCH * L,
        seed=SEED,
        work_dir=str(tmp_path / "work"),
        save_folder=str(tmp_path / "x"),
    )
    config_json = core.save_config_json(config, tmp_path / "olmo-core")
    reference = core.drive_loader(config, world_size=1, last_step=STEPS, monkeypatch=monkeypatch)
    return config_json, config, reference[0]


def block_diagonal(doc_lens: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """From OLMo-core's doc_lens: the (B, 1, L, L) bool mask (query t sees key s <= t of its own document) and each
    token's position within its document (OLMo-core's intra-document RoPE)."""
    masks, positions = [], []
    for lens in doc_lens:
        assert lens.sum() == L
        doc = np.repeat(np.arange(len(lens)), lens)
        masks.append((doc[:, None] == doc[None, :]) & np.tri(L, dtype=bool))
        positions.append(np.concatenate([np.arange(n) for n in lens]))
    return torch.from_numpy(np.stack(masks))[:, None], torch.from_numpy(np.stack(positions))


def reference_losses(model: Transformer, step: Any, positions: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's cross-entropy sum of `model` on OLMo-core's batch: within its documents by the mask built here
    (positions restarting with `positions`), and unmasked."""
    ids = torch.from_numpy(step.input_ids)
    labels = labels_for(ids, torch.from_numpy(step.label_mask), None)
    mask, pos = block_diagonal(step.doc_lens)
    with torch.no_grad():
        masked = model(ids, labels=labels, mask=mask, positions=pos if positions else None, instance_losses=True)[2]
        plain = model(ids, labels=labels, instance_losses=True)[2]
    return masked, plain


def first_document_files(config: Any) -> tuple[dict[int, str], int]:
    """Per OLMo-core instance, the file of its first document, read from the packing files OLMo-core's own dataset
    names (and wrote); and how many instances hold documents of more than one file."""
    dataset = config.dataset.build()
    dataset.work_dir = Path(config.data_loader.work_dir)
    out, mixed = {}, 0
    for g, (lo, hi) in enumerate(dataset.source_instance_offsets):
        paths = dataset._source_path_groups[g]
        bounds = np.cumsum([0, *dataset.source_size_groups[g]])

        def read(path: Any) -> np.ndarray:
            return np.fromfile(path, dtype=np.uint64).astype(np.int64)

        offsets = read(dataset._get_instance_offsets_path(*paths)).reshape(-1, 2)
        by_instance = read(dataset._get_docs_by_instance_path(*paths))
        documents = read(dataset._get_document_indices_path(*paths)).reshape(-1, 2)
        for j in range(hi - lo):
            docs = by_instance[offsets[j, 0] : offsets[j, 1]]
            files = np.searchsorted(bounds, documents[docs, 0], side="right") - 1
            out[lo + j] = str(paths[files[0]])
            mixed += len(set(files.tolist())) > 1
    return out, mixed


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_trains_on_packed_batches_within_their_documents(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nproc: int
) -> None:
    """3 steps on 1 process (and on 2, torchrun: rank 1 reads its own rows and doc_lens), document masking with
    positions restarting (what OLMo-core's model does with doc_lens): OLMo-core's fingerprints, each source's
    supervised tokens by first document, and step 1's loss (the initial weights) that of the mask built here
    from OLMo-core's doc_lens."""
    config_json, config, reference = packed_run(core, tmp_path, monkeypatch)
    want = [batch_fingerprint(s.input_ids) for s in reference]
    assert len(set(want)) == STEPS
    mine = ours(tmp_path, config_json, document_masking=True, document_positions=True, document_attention="mask")
    launch(mine, nproc)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/batch_fingerprint"] for m in metrics] == want
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["eos_token_id"] == EOS and saved["global_train_batch_size"] == PER_BATCH
    # sources: each instance under its first document's file, by OLMo-core's own packing files
    first, mixed = first_document_files(config)
    assert mixed > 0  # some instances hold documents of two files: the rule matters
    for m, step in zip(metrics, reference, strict=True):
        tokens: dict[str, int] = {}
        for row, instance in enumerate(step.index.tolist()):
            path = first[instance]
            tokens[path] = tokens.get(path, 0) + int(step.label_mask[row, 1:].sum())
        head, tail = "train/source/", "/supervised_tokens"
        logged = {k[len(head) : -len(tail)]: v for k, v in m.items() if k.startswith(head) and k.endswith(tail)}
        assert {p: n for p, n in logged.items() if n} == tokens, m["step"]
    # step 1 trained the initial weights (build_model's seed): its loss is the mask's, not the unmasked one
    torch.manual_seed(1)
    model = Transformer(load_config(mine).model)
    masked, plain = reference_losses(model, reference[0], positions=True)
    supervised = int(reference[0].label_mask[:, 1:].sum())
    assert metrics[0]["train/supervised_tokens"] == supervised
    assert metrics[0]["train/loss"] == pytest.approx(float(masked.sum()) / supervised, rel=1e-5)
    assert abs(float(plain.sum()) - float(masked.sum())) / supervised > 1e-3


def test_the_trainer_path_masks_as_olmo_core_doc_lens_say(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: TrainData's batch of step 1 (OLMo-core's tokens, doc_starts from its doc_lens), through the
    training forward, gives every row the loss of the block-diagonal mask built here from the loader's own
    doc_lens; the unmasked loss differs. Positions as the model's default (not restarted; the test above
    restarts them)."""
    config_json, _, reference = packed_run(core, tmp_path, monkeypatch)
    cfg = load_config(ours(tmp_path, config_json, document_masking=True, document_attention="mask"))
    data = TrainData(cfg, SINGLE)
    try:
        batch = data.batch(1)
    finally:
        data.close()
    step = reference[0]
    np.testing.assert_array_equal(batch.input_ids.numpy(), step.input_ids)
    assert batch.doc_starts is not None
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    labels = labels_for(batch.input_ids, batch.label_mask, batch.instance_mask)
    with torch.no_grad():
        _, _, rows = forward_instance_losses(model, batch.input_ids, labels, batch.doc_starts)
    masked, plain = reference_losses(model, step, positions=False)
    torch.testing.assert_close(rows, masked, rtol=1e-6, atol=1e-6)
    assert ((rows - plain).abs() > 1e-3).sum() >= len(rows) // 2  # most rows hold several documents


def test_doc_lens_without_generate_doc_lengths_and_the_warnings(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run without generate_doc_lengths still splits by OLMo-core's rule (the doc_lens its loader yields with
    it); masking it warns that OLMo-core attended across documents; no masking on a run with doc_lens warns too."""
    config_json, _, reference = packed_run(core, tmp_path / "a", monkeypatch, generate_doc_lengths=False)
    from olmo_core.data.utils import get_document_lengths

    step = reference[0]
    assert step.doc_lens is None
    theirs = [get_document_lengths(torch.from_numpy(row), EOS).numpy() for row in step.input_ids]
    cfg = load_config(ours(tmp_path / "a", config_json, document_masking=True, document_attention="mask"))
    with caplog.at_level(logging.WARNING, logger="olmo_train"):
        data = TrainData(cfg, SINGLE)
    try:
        starts = data.batch(1).doc_starts
    finally:
        data.close()
    assert "OLMo-core's run attended across its packed documents" in caplog.text
    assert starts is not None
    np.testing.assert_array_equal(starts.numpy(), doc_starts(theirs, L, step.index))
    caplog.clear()
    config_json, _, _ = packed_run(core, tmp_path / "b", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="olmo_train"):
        open_olmo_core_data(load_config(ours(tmp_path / "b", config_json)), 1)
    assert "attended within its packed documents" in caplog.text and "this run attends across them" in caplog.text


# -- refusals (no OLMo-core needed) -------------------------------------------------------------------------------


def test_document_masking_is_refused_for_unpacked_runs_and_another_eos(tmp_path: Path) -> None:
    fsl = minimal(tmp_path)
    fsl["dataset"]["_CLASS_"] = "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig"
    (tmp_path / "fsl.json").write_text(json.dumps(fsl))
    with pytest.raises(ConfigError, match="'model.document_masking': with data.olmo_core only for OLMo-core's Numpy"):
        open_olmo_core_data(load_config(ours(tmp_path, str(tmp_path / "fsl.json"), document_masking=True)), 1)
    (tmp_path / "packed.json").write_text(json.dumps(minimal(tmp_path, generate_doc_lengths=True)))
    cfg = load_config(ours(tmp_path, str(tmp_path / "packed.json"), document_masking=True, eos_token_id=EOS + 5))
    with pytest.raises(ConfigError, match=f"'model.eos_token_id': {EOS + 5}, but OLMo-core's run .* {EOS}"):
        open_olmo_core_data(cfg, 1)
    cfg = load_config(ours(tmp_path, str(tmp_path / "packed.json"), document_masking=True))
    assert open_olmo_core_data(cfg, 1).run.kind == "packed" and cfg.model.eos_token_id == EOS
