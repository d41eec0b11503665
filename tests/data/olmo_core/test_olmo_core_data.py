"""olmo_data.olmo_core against OLMo-core itself: the batch of every step, on every rank, instance for instance.

OLMo-core's real config classes build the run (and write its config.json as its ConfigSaverCallback does); its
real dataset classes and NumpyFSLDataLoader, driven as its Trainer drives them (a BatchSizeSchedulerCallback
included), yield the reference batches over token files made by our tokenizer. Our reading of the config.json
alone must give the same instances, tokens, label masks and batch fingerprints, at the config's own seed.
Tests that need OLMo-core skip, saying so, where `ai2-olmo-core` is not installed; the refusals run without it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.errors import DataError
from olmo_data.olmo_core import (
    is_olmo_core_config,
    open_olmo_core,
    order_file_name,
    read_olmo_core_config,
    write_olmo_core_order,
)
from tests.olmo_core_commands import check_commands

L = 64  # tokens per instance
SEED = 6198
WORLD = 2


@pytest.fixture(scope="module")
def token_paths(demo_token_parts: list[str]) -> list[str]:
    """Token files of one demo shard in ~4,000-token parts (conftest.py), at least 20 of them."""
    assert len(demo_token_parts) >= 20, demo_token_parts
    return demo_token_parts


@pytest.fixture(scope="module")
def small(token_paths: list[str]) -> list[str]:
    """The token files of fewer than 4,500 tokens (a few dozen instances each), so that epochs are short."""
    out = [p for p in token_paths if os.path.getsize(p) // 2 < 4_500]
    assert len(out) >= 6
    return out


def steps_for(paths: list[str], per_batch: int, epochs: int = 3) -> int:
    """A last step inside epoch `epochs` + 1 of plain FSL data over `paths` (uint16 token files)."""
    instances = sum(os.path.getsize(p) // 2 // L for p in paths)
    return epochs * (instances // per_batch) + 2


@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A loopback file server with Range support, as object stores serve files (no faults): (root, URL). One
    request per connection: OLMo-core reads metadata in forked processes, which would share kept-alive sockets."""
    from tests.flaky_server import FlakyServer

    root = tmp_path / "www"
    root.mkdir()
    server = FlakyServer(root)
    server._server.RequestHandlerClass.protocol_version = "HTTP/1.0"  # type: ignore[attr-defined]
    with server:
        yield root, server.url


def fsl(core: Any, paths: list[str], **kw: Any) -> Any:
    from olmo_core.data import NumpyFSLDatasetConfig

    return NumpyFSLDatasetConfig(tokenizer=core.tokenizer_config(), paths=paths, sequence_length=L, **kw)


def run_and_compare(
    core: Any,
    tmp_path: Path,
    dataset: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    instances_per_batch: int = 8,
    seq_len: int = L,
    last_step: int,
    min_epoch: int = 3,
    **experiment: Any,
) -> Any:
    """Drive OLMo-core's loader to `last_step` on WORLD ranks; check every step of ours against it."""
    work_dir = str(tmp_path / "work")
    config = core.experiment_config(
        dataset,
        global_batch_size=instances_per_batch * seq_len,
        seed=SEED,
        work_dir=work_dir,
        save_folder=str(tmp_path / "save"),
        **experiment,
    )
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    reference = core.drive_loader(config, world_size=WORLD, last_step=last_step, monkeypatch=monkeypatch)
    assert len(reference[0]) == last_step, "OLMo-core's loader ran out of batches"
    assert max(s.epoch for s in reference[0]) >= min_epoch  # steps in the first, second and a later epoch
    data = open_olmo_core(config_json)
    assert data.run.seed == SEED
    for step in range(1, last_step + 1):
        ours = data.batch(step)
        want = core.global_rows(reference, step, "index")
        np.testing.assert_array_equal(ours.instances, want, err_msg=f"step {step}")
        assert ours.epoch == reference[0][step - 1].epoch
        assert ours.fingerprint == batch_fingerprint(core.global_rows(reference, step, "input_ids"))
        for rank in range(WORLD):
            mine = data.batch(step, rank, WORLD)
            theirs = reference[rank][step - 1]
            np.testing.assert_array_equal(mine.rank_instances, theirs.index)
            np.testing.assert_array_equal(mine.tokens, theirs.input_ids, err_msg=f"step {step} rank {rank}")
            for field in ("label_mask", "instance_mask"):
                if getattr(theirs, field) is None:
                    assert getattr(mine, field) is None, field
                else:
                    np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field), err_msg=field)
    # and back, as trace asks: the steps (and ranks) that trained an instance, for instances across the dataset
    trained: dict[int, list[tuple[int, int]]] = {}
    for rank, steps in reference.items():
        for s in steps:
            for i in s.index.tolist():
                trained.setdefault(i, []).append((s.step, rank))
    for instance in np.linspace(0, len(data.dataset) - 1, 40).astype(int).tolist():
        got = [(t.step, t.rank) for t in data.steps_of(instance, last_step, world_size=WORLD)]
        assert got == sorted(trained.get(instance, [])), instance
    # the commands on the config.json alone: inspect-batch --json and trace, against OLMo-core's loader
    check_commands(config_json, config, reference)
    return data, reference, work_dir


def test_plain_fsl_every_step_on_two_ranks(
    core: Any, small: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Globbed paths, OLMo-core's source_permutation_seed, dtype from the vocabulary, 1-based epochs."""
    (tmp_path / "globbed").mkdir()
    files = []
    for p in small[:5]:
        files.append(str(tmp_path / "globbed" / os.path.basename(p)))
        os.symlink(p, files[-1])
        os.symlink(p[: -len(".npy")] + ".csv.gz", files[-1][: -len(".npy")] + ".csv.gz")  # its documents
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    dataset = fsl(
        core,
        [str(tmp_path / "globbed" / "*.npy")],
        expand_glob=True,
        source_permutation_seed=3,
        instance_filter_config=InstanceFilterConfig(repetition_max_count=4),
    )
    last = steps_for(files, 8)
    data, reference, work_dir = run_and_compare(core, tmp_path, dataset, monkeypatch, last_step=last)
    assert sorted(data.run.paths) == sorted(files) and list(data.run.paths) != sorted(files)
    assert data.run.dtype == "uint16"
    kept = np.concatenate([s.instance_mask for s in reference[0]])
    assert kept.any() and not kept.all()  # the filter (at 4 copies) dropped some instances of this text
    # its orders were found where OLMo-core wrote them, under the names it gives them
    n = len(data.dataset)
    for epoch in (1, 2):
        assert os.path.isfile(os.path.join(work_dir, order_file_name(n, epoch, SEED)))
        assert data.epoch_order(epoch).note.startswith("read from")
    assert (
        os.path.basename(data.epoch_order(1).path or "") == f"global_indices_dataset_size{n}_epoch1_seed{SEED}_v1.npy"
    )
    # the JSON record names each instance's tokens where they are (checked against the rank's tokens)
    record = json.loads(json.dumps(data.record(data.batch(last, 1, WORLD))))
    assert record["step"] == last and record["epoch"] == reference[1][-1].epoch and len(record["instances"]) == 4
    for row, inst in zip(reference[1][-1].input_ids, record["instances"], strict=True):
        assert inst["length"] == L and inst["trained"] in (True, False)
        np.testing.assert_array_equal(np.fromfile(inst["path"], dtype=np.uint16)[inst["start"] :][:L], row)
    # the first epoch is PCG64(seed + 1): our own epoch-0-based build_order one epoch on
    from olmo_data.dataset.order import build_order

    np.testing.assert_array_equal(data.epoch_order(1).order, build_order(n, SEED, epoch=1))
    # and written here, an order is OLMo-core's file byte for byte, under its name
    mine = write_olmo_core_order(str(tmp_path / "ours"), n, SEED, 2)
    assert Path(mine).read_bytes() == Path(work_dir, os.path.basename(mine)).read_bytes()
    # away from the training machine the orders are rebuilt, identically, and the note says so
    elsewhere = open_olmo_core(str(tmp_path / "save" / "step0" / "config.json"), work_dir=str(tmp_path / "none"))
    for step in (1, last // 2, last):
        again = elsewhere.batch(step)
        assert again.order_note.startswith("rebuilt") and "not found" in again.order_note
        assert again.fingerprint == data.batch(step).fingerprint


def write_label_masks(paths: list[str], folder: Path) -> list[str]:
    """A bool label mask beside each token file (seeded noise: only its bytes matter here)."""
    rng = np.random.default_rng(0)
    out = []
    for p in paths:
        out.append(str(folder / (os.path.basename(p) + ".mask")))
        (rng.random(os.path.getsize(p) // 2) < 0.8).tofile(out[-1])
    return out


def test_label_masks_of_plain_fsl(core: Any, small: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Label mask files beside the token files come with each instance (run_and_compare checks them)."""
    masks = write_label_masks(small[:3], tmp_path)
    dataset = fsl(core, small[:3], label_mask_paths=masks)
    _, reference, _ = run_and_compare(core, tmp_path, dataset, monkeypatch, last_step=steps_for(small[:3], 8))
    got = np.concatenate([s.label_mask for s in reference[1]])
    assert got.any() and not got.all()


def test_padded_fsl_one_document_per_instance(
    core: Any, token_paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every document of the shard is one instance of 1,024 tokens (the demo's documents are whole modules)."""
    from olmo_core.data import NumpyPaddedFSLDatasetConfig

    seq = 1024
    dataset = NumpyPaddedFSLDatasetConfig(
        tokenizer=core.tokenizer_config(),
        paths=token_paths,
        sequence_length=seq,
        label_mask_paths=write_label_masks(token_paths, tmp_path),
    )
    data, reference, work_dir = run_and_compare(
        core, tmp_path, dataset, monkeypatch, instances_per_batch=4, seq_len=seq, last_step=40
    )
    ids = np.concatenate([s.input_ids for s in reference[0]])
    masks = np.concatenate([s.label_mask for s in reference[0]])
    assert (ids[:, -1] == 1).any() and not masks[ids[:, -1] == 1, -1].any()  # short documents padded, masked
    # the same instances without OLMo-core's work files: documents found by their EOS tokens here
    run = read_olmo_core_config(str(tmp_path / "save" / "step0" / "config.json"), work_dir=str(tmp_path / "none"))
    from olmo_data.olmo_core import OlmoCoreData

    rebuilt = OlmoCoreData(run)
    assert len(rebuilt.dataset) == len(data.dataset)
    assert "instance-indices" in " ".join(os.listdir(os.path.join(work_dir, "dataset-common")))
    for step in (1, 17, 40):
        assert rebuilt.batch(step).fingerprint == data.batch(step).fingerprint


def test_padded_fsl_with_a_bos_token(
    core: Any, token_paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BOS id does not change where OLMo-core's padded dataset cuts documents (every EOS ends one), though its
    EOS-scan helper knows a BOS rule: a token that follows some EOS stands in for a BOS here."""
    from olmo_core.data import NumpyPaddedFSLDatasetConfig, TokenizerConfig

    tokens = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in token_paths])
    after_eos = tokens[1:][tokens[:-1] == 0]
    bos = int(np.argsort(np.bincount(after_eos))[-2])
    tokenizer = TokenizerConfig(vocab_size=2048, eos_token_id=0, pad_token_id=1, bos_token_id=bos)
    seq = 1024
    dataset = NumpyPaddedFSLDatasetConfig(tokenizer=tokenizer, paths=token_paths, sequence_length=seq)
    data, _, _ = run_and_compare(
        core, tmp_path, dataset, monkeypatch, instances_per_batch=2, seq_len=seq, last_step=30, min_epoch=2
    )
    assert data.run.bos_token_id == bos and len(data.dataset) == int((tokens == 0).sum())
    elsewhere = open_olmo_core(str(tmp_path / "save" / "step0" / "config.json"), work_dir=str(tmp_path / "none"))
    for step in (1, 30):  # without OLMo-core's index files, the same documents from the EOS tokens
        assert elsewhere.batch(step).fingerprint == data.batch(step).fingerprint


def test_padded_fsl_over_http_reads_documents_from_the_metadata(
    core: Any,
    token_paths: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    range_server: tuple[Path, str],
) -> None:
    """Remote token files: OLMo-core (and we) take a padded dataset's documents from the .csv.gz beside each."""
    import shutil

    from olmo_core.data import NumpyPaddedFSLDatasetConfig

    root, url = range_server
    urls = []
    for p in token_paths[:12]:
        for suffix in (".npy", ".csv.gz"):
            shutil.copy(p[: -len(".npy")] + suffix, root / (os.path.basename(p)[: -len(".npy")] + suffix))
        urls.append(f"{url}/{os.path.basename(p)}")
    seq = 512
    dataset = NumpyPaddedFSLDatasetConfig(tokenizer=core.tokenizer_config(), paths=urls, sequence_length=seq)
    data, _, _ = run_and_compare(
        core, tmp_path, dataset, monkeypatch, instances_per_batch=2, seq_len=seq, last_step=12, min_epoch=2
    )
    assert all(loc.path.startswith("http://") for loc in data.locate(range(len(data.dataset))))


def test_max_target_sequence_length_shuffles_chunks(
    core: Any, small: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = fsl(core, small[:4], max_target_sequence_length=4 * L)
    last = steps_for(small[:4], 8)
    data, _, work_dir = run_and_compare(core, tmp_path, dataset, monkeypatch, last_step=last)
    assert data.run.chunk_size == 4
    order = data.epoch_order(2).order
    assert (order.reshape(-1, 4) % 4 == np.arange(4)).all()  # whole chunks, in place
    found = data.epoch_order(2).path or ""
    assert os.path.basename(found).startswith("global_indices_chunk4_dataset_size")
    mine = write_olmo_core_order(str(tmp_path / "ours"), len(data.dataset), SEED, 2, chunk_size=4)
    assert os.path.basename(mine) == os.path.basename(found) and Path(mine).read_bytes() == Path(found).read_bytes()


def test_two_source_mixture(core: Any, small: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLMo-core's allocation (a source repeated past its size, Hamilton rounding) and its first instances."""
    from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList

    sources = SourceMixtureList(
        sources=[
            SourceMixtureConfig(source_name="web", target_ratio=0.55, paths=small[:3]),
            SourceMixtureConfig(source_name="code", target_ratio=0.45, paths=[small[3]], max_repetition_ratio=3.0),
        ]
    )
    requested = 9_000
    mixture = SourceMixtureDatasetConfig(
        source_list=sources, requested_tokens=requested, global_batch_size=8 * L, seed=11, quiet=True
    )
    from olmo_core.data import NumpyFSLDatasetConfig

    dataset = NumpyFSLDatasetConfig.from_src_mix(mixture, tokenizer=core.tokenizer_config(), sequence_length=L)
    data, _, _ = run_and_compare(core, tmp_path, dataset, monkeypatch, last_step=60)
    built = dataset.source_mixture_config.build(npdtype=np.uint16, sequence_length=L)
    built.filter_zero_token_paths = True
    assert data.dataset.paths == [str(p) for p in built.to_paths()]
    assert data.dataset.file_tokens == list(built.to_index().values())
    assert data.dataset.paths.count(small[3]) >= 2  # the code source was repeated
    assert len(data.dataset) * L == -(-requested // (8 * L)) * 8 * L  # whole steps


@pytest.mark.parametrize(
    ("unit", "points", "configured"),
    [("steps", (5, 30), 4), ("tokens", (5 * 4 * L, 90 * 4 * L), 8), ("epochs", (1, 2), 4)],
)
def test_batch_size_schedule(
    core: Any,
    small: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unit: str,
    points: tuple[int, int],
    configured: int,
) -> None:
    """4 instances (overriding the loader's own size where it differs), then 16 (applied only once the batches
    drawn in the epoch allow it), then 8; in each of OLMo-core's duration units."""
    from olmo_core.train import Duration

    dataset = fsl(core, small[:2])
    last = 70
    data, reference, _ = run_and_compare(
        core,
        tmp_path,
        dataset,
        monkeypatch,
        instances_per_batch=configured,
        last_step=last,
        batch_sizes=[4 * L, 16 * L, 8 * L],
        schedule=[Duration(0, unit), Duration(points[0], unit), Duration(points[1], unit)],
    )
    for instance in (0, 7, 50, len(data.dataset) - 1):
        want = sorted((s.step, r) for r, steps in reference.items() for s in steps if instance in s.index)
        assert [(t.step, t.rank) for t in data.steps_of(instance, last, world_size=WORLD)] == want
    sizes = [len(s.index) * WORLD for s in reference[0]]
    assert sizes[:5] == [4] * 5 and 16 in sizes and sizes[-1] == 8
    if unit == "steps":
        assert sizes.index(16) > 5  # the increase waited for a whole multiple of batches


@pytest.mark.parametrize("seed", range(4))
def test_random_batch_size_schedules(
    core: Any, small: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Seeded schedules of 2 to 4 batch sizes (factors 2 and 4, up and down, in any unit), 120 steps each:
    increases that wait, decreases that reopen an epoch's tail, changes at an epoch's end."""
    from olmo_core.train import Duration

    rng = np.random.default_rng(seed)
    unit = ["steps", "tokens", "epochs"][seed % 3]
    sizes = [int(rng.choice([2, 4, 8]))]
    while len(sizes) < int(rng.integers(2, 5)):
        options = [x for x in (sizes[-1] * 2, sizes[-1] * 4, sizes[-1] // 2, sizes[-1] // 4) if 2 <= x <= 16]
        sizes.append(int(rng.choice(options)))
    gaps = rng.integers(1, 4, len(sizes) - 1) if unit == "epochs" else rng.integers(3, 40, len(sizes) - 1)
    starts = [0] + np.cumsum(gaps).tolist()
    scale = 4 * L if unit == "tokens" else 1
    run_and_compare(
        core,
        tmp_path,
        fsl(core, small[:1]),
        monkeypatch,
        instances_per_batch=sizes[0],
        last_step=120,
        min_epoch=2,
        batch_sizes=[x * L for x in sizes],
        schedule=[Duration(int(x) * scale, unit) for x in starts],
    )


def test_config_json_is_recognised_and_read(core: Any, small: list[str], tmp_path: Path) -> None:
    config = core.experiment_config(
        fsl(core, small[:2], dtype="uint16"), global_batch_size=8 * L, seed=5, work_dir=None, save_folder="/x"
    )
    path = core.save_config_json(config, tmp_path)
    raw = json.loads(Path(path).read_text())
    assert is_olmo_core_config(raw) and not is_olmo_core_config({"data": {"paths": ["a"]}})
    run = read_olmo_core_config(path)
    assert (run.global_batch_size, run.seed, run.sequence_length, run.kind) == (8 * L, 5, L, "fsl")
    assert run.work_dir == tempfile.gettempdir() and run.pad_token_id == 1 and run.eos_token_id == 0


# -- refusals (no OLMo-core needed) -------------------------------------------------------------------------------


def minimal(dataset_class: str = "NumpyFSLDatasetConfig", **dataset: Any) -> dict[str, Any]:
    return {
        "dataset": {
            "_CLASS_": f"olmo_core.data.numpy_dataset.{dataset_class}",
            "tokenizer": {"vocab_size": 2048, "eos_token_id": 0, "pad_token_id": 1},
            "paths": ["/data/a.npy"],
            "sequence_length": L,
            **dataset,
        },
        "data_loader": {
            "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
            "global_batch_size": 8 * L,
            "seed": 1,
        },
        "trainer": {"callbacks": {}},
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (minimal("NumpyInterleavedFSLDatasetConfig"), "dataset.docs_per_instance is None; expected a whole number"),
        (minimal("NumpyVSLDatasetConfig"), "dataset.sequence_length is not a key of OLMo-core's NumpyVSLDatasetConfig"),
        (
            {**minimal(), "dataset": {**minimal()["dataset"], "_CLASS_": "olmo_core.data.composable.X"}},
            "dataset is olmo_core.data.composable.X; not covered",
        ),
        (
            minimal(paths=None, mix="OLMoE-mix-0824"),
            "named data mix 'OLMoE-mix-0824', whose files",
        ),
        (minimal(max_target_sequence_length=L + 1), "must be a multiple of sequence_length"),
        (minimal(max_target_sequence_length="4k"), "dataset.max_target_sequence_length is '4k'; expected a whole"),
        (
            minimal(
                paths=None,
                source_mixture_config={
                    "_CLASS_": "olmo_core.data.source_mixture.SourceMixtureDatasetConfig",
                    "source_list": {"sources": [{"source_name": "a", "paths": ["/x.npy"]}]},
                },
            ),
            "sources[0].target_ratio is None; expected a number",
        ),
        ({"data": {"paths": ["a"]}}, "no dataset section"),
        (minimal(_CLASS_="mine.Dataset"), "dataset._CLASS_ is 'mine.Dataset'"),
        (
            {
                **minimal(),
                "trainer": {
                    "callbacks": {"seq": {"_CLASS_": "olmo_core.train.callbacks.SequenceLengthSchedulerCallback"}}
                },
            },
            "trainer.callbacks.seq is OLMo-core's SequenceLengthSchedulerCallback",
        ),
        (
            {**minimal(), "data_loader": {**minimal()["data_loader"], "global_batch_size": 100}},
            "global_batch_size (100 tokens) must be a positive multiple",
        ),
    ],
)
def test_refusals_name_the_class_or_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=None) as e:
        read_olmo_core_config(config)
    assert message in str(e.value)


def test_a_world_size_that_splits_instances_is_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "a.npy"
    (np.arange(40 * L, dtype=np.uint16) % 2000).tofile(tokens)  # ids of the 2,048-token vocabulary
    config = minimal(paths=[str(tokens)])
    data = open_olmo_core(config)
    with pytest.raises(DataError, match="cannot be split over 3 ranks"):
        data.batch(1, 0, 3)
    assert data.batch(6).epoch == 2  # 40 instances, batches of 8: five steps an epoch
    with pytest.raises(DataError, match="token file .*missing.npy cannot be read"):
        open_olmo_core(minimal(paths=[str(tmp_path / "missing.npy")]))
