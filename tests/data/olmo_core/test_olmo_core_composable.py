"""OLMo-core's composable data API rebuilt (olmo_data.olmo_core.composable), against OLMo-core 3.0.0 itself.

OLMo-core's real config classes describe each run and write its config.json (`as_config_dict`, as its
ConfigSaverCallback does); its real sources are built from those configs and its real ComposableDataLoader,
driven as its Trainer drives it (`reshuffle(epoch)`, a batch-size callback before each batch, `reset()` after each
epoch), yields the reference batches on 2 ranks from epoch 1 into epoch 3. Our reading of the config.json alone must
give every step's instance ids, tokens, label masks, doc_lens and the global batch's fingerprint. One test per
source kind and shuffle strategy; the refusals run without OLMo-core. The token files are tiny and seeded.
"""

from __future__ import annotations

import gzip
import json
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.errors import DataError
from olmo_data.olmo_core import open_olmo_core
from tests.data.olmo_core.checks import inspected_rows, write_metadata

L = 16
SEED = 4321
WORLD = 2
EOS, PAD, VOCAB = 0, 1, 2048


def token_files(
    folder: Path, n_files: int = 3, seed: int = 0, bos: int | None = None, masks: bool = False, metadata: bool = False
) -> list[str]:
    """Seeded uint16 token files of documents 1..40 tokens long, each ended by EOS, then a tail without one;
    with `masks`, a label mask file (one byte a token) beside each, named `*.mask.npy`; with `metadata`, a
    tokenize-style .csv.gz beside each (the commands' document lookups; OLMo-core reads local files' EOS)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(n_files):
        docs = []
        for _ in range(int(rng.integers(8, 16))):
            body = rng.integers(2, VOCAB, size=int(rng.integers(1, 40))).astype(np.uint16)
            if bos is not None:
                body[0] = bos
            docs.append(np.append(body, np.uint16(EOS)))
        docs.append(rng.integers(2, VOCAB, size=int(rng.integers(1, 6))).astype(np.uint16))
        out.append(str(folder / f"part-{f:02d}.npy"))
        np.concatenate(docs).tofile(out[-1])
        if masks:
            n = sum(len(d) for d in docs)
            (rng.random(n) < 0.7).tofile(out[-1].replace(".npy", ".mask.npy"))
        if metadata:
            write_metadata(out[-1], [len(d) for d in docs[:-1]], f"doc-{seed}-{f}", "src.jsonl")
    return out


def tokenizer(bos: int | None = None) -> Any:
    from olmo_core.data import TokenizerConfig

    return TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=bos)


def numpy_source(paths: list[str], **kw: Any) -> Any:
    from olmo_core.data.composable import NumpyDocumentSourceConfig

    return NumpyDocumentSourceConfig(source_paths=paths, tokenizer=kw.pop("tokenizer", None) or tokenizer(), **kw)


def chunked(sources: list[Any], **kw: Any) -> Any:
    from olmo_core.data.composable import ConcatAndChunkInstanceSourceConfig

    return ConcatAndChunkInstanceSourceConfig(sources=sources, sequence_length=kw.pop("sequence_length", L), **kw)


@dataclass
class Step:
    """What one rank's loader yielded at one step."""

    epoch: int
    index: np.ndarray
    input_ids: np.ndarray
    label_mask: np.ndarray | None
    instance_mask: np.ndarray | None
    doc_lens: list[np.ndarray] | None


def save_config(tmp_path: Path, dataset: list[Any], loader: Any, trainer: Any) -> str:
    """config.json as OLMo-core's experiment scripts save it: its ExperimentConfig's data sections (a dataset
    list of instance source configs, a ComposableDataLoaderConfig) and trainer, through `as_config_dict`."""
    from olmo_core.config import Config
    from olmo_core.data.composable import ComposableDataLoaderConfig
    from olmo_core.train import TrainerConfig

    @dataclass
    class Experiment(Config):  # olmo_core.internal.experiment.ExperimentConfig's data and trainer fields
        dataset: list[Any]
        data_loader: ComposableDataLoaderConfig
        trainer: TrainerConfig

    folder = tmp_path / "save" / "step0"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(Experiment(dataset, loader, trainer).as_config_dict()))
    return str(path)


def run(
    core: Any,
    tmp_path: Path,
    dataset: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    *,
    per_batch: int = 4,
    batch_sizes: list[int] | None = None,
    schedule: list[Any] | None = None,
    **loader_kw: Any,
) -> tuple[str, dict[int, list[Step]]]:
    """config.json of a run on these sources, and OLMo-core's batches for it on WORLD ranks from step 1 into
    epoch 3, its loader driven as its Trainer drives it."""
    import olmo_core.distributed.utils as dist_utils
    from olmo_core.data.composable import ComposableDataLoaderConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import BatchSizeSchedulerCallback

    work = str(tmp_path / "work")
    loader_config = ComposableDataLoaderConfig(
        tokenizer=tokenizer(loader_kw.pop("bos", None)),
        global_batch_size=per_batch * L,
        seed=SEED,
        work_dir=work,
        display_source_visualization=False,
        **loader_kw,
    )
    trainer = TrainerConfig(save_folder=str(tmp_path / "save"), max_duration=Duration.epochs(4))
    if batch_sizes:
        trainer = trainer.with_callback(
            "batch_size_scheduler", BatchSizeSchedulerCallback(batch_sizes=batch_sizes, schedule=schedule or [])
        )
    config_json = save_config(tmp_path, dataset, loader_config, trainer)
    sources = [s.build(work) for s in dataset]  # as olmo_core.internal.experiment builds them, once
    out: dict[int, list[Step]] = {}
    for rank in range(WORLD):
        monkeypatch.setattr(dist_utils, "get_world_size", lambda group=None: WORLD)
        monkeypatch.setattr(dist_utils, "get_rank", lambda group=None, rank=rank: rank)
        loader = loader_config.build(*sources)
        monkeypatch.undo()
        assert loader.dp_rank == rank
        out[rank] = drive(core, loader, trainer, batch_sizes, schedule)
    return config_json, out


def drive(core: Any, loader: Any, trainer_config: Any, batch_sizes: Any, schedule: Any) -> list[Step]:
    """One rank's batches: OLMo-core's Trainer loop over epochs 1, 2 and into 3."""
    from olmo_core.train.callbacks import BatchSizeSchedulerCallback

    trainer = types.SimpleNamespace(
        data_loader=loader,
        global_step=0,
        global_train_tokens_seen=0,
        epoch=1,
        train_module=core._stub_train_module(),
        callbacks={},
        max_duration=trainer_config.max_duration,
    )
    callbacks = []
    if batch_sizes:
        cb = BatchSizeSchedulerCallback(batch_sizes=list(batch_sizes), schedule=list(schedule or []))
        cb.trainer = trainer  # type: ignore[assignment]
        cb.post_attach()
        callbacks.append(cb)
    steps: list[Step] = []
    while trainer.epoch <= 3:
        loader.reshuffle(trainer.epoch)
        batches = iter(loader)
        taken = 0
        while trainer.epoch < 3 or taken < 2:
            for cb in callbacks:
                cb.pre_load_batch()
            batch = next(batches, None)
            if batch is None:
                break
            taken += 1
            trainer.global_step += 1
            trainer.global_train_tokens_seen += loader.global_num_tokens_in_batch(batch)
            mask, keep, lens = batch.get("label_mask"), batch.get("instance_mask"), batch.get("doc_lens")
            steps.append(
                Step(
                    trainer.epoch,
                    batch["index"].numpy().astype(np.int64),
                    batch["input_ids"].numpy().astype(np.int64),
                    mask.numpy().astype(bool) if mask is not None else None,
                    keep.numpy().astype(bool) if keep is not None else None,
                    [row[row > 0].astype(np.int32) for row in lens.numpy()] if lens is not None else None,
                )
            )
        trainer.epoch += 1
        loader.reset()
    return steps


def global_rows(per_rank: dict[int, list[Step]], step: int, field: str) -> np.ndarray:
    parts = [getattr(per_rank[r][step - 1], field) for r in range(WORLD)]
    out = np.empty((sum(len(p) for p in parts),) + parts[0].shape[1:], dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        out[r::WORLD] = part
    return out


def compare(config_json: str, reference: dict[int, list[Step]], offsets: dict[int, int] | None = None) -> Any:
    """Every step, every rank: ids (OLMo-core's index, plus `offsets[epoch]` with sources_per_epoch), tokens,
    label masks, instance masks, doc_lens, the global fingerprint; and the steps reach epoch 3."""
    data = open_olmo_core(config_json)
    assert data.run.kind == "composable"
    assert reference[0][-1].epoch == 3 and len(reference[0]) == len(reference[1])
    for step in range(1, len(reference[0]) + 1):
        ours, theirs = data.batch(step), reference[0][step - 1]
        assert ours.epoch == theirs.epoch, step
        shift = (offsets or {}).get(theirs.epoch, 0)
        np.testing.assert_array_equal(ours.instances, global_rows(reference, step, "index") + shift, err_msg=str(step))
        assert ours.fingerprint == batch_fingerprint(global_rows(reference, step, "input_ids"))
        for rank in range(WORLD):
            mine, theirs = data.batch(step, rank, WORLD), reference[rank][step - 1]
            np.testing.assert_array_equal(mine.tokens, theirs.input_ids, err_msg=f"step {step} rank {rank}")
            for field in ("label_mask", "instance_mask"):
                want, got = getattr(theirs, field), getattr(mine, field)
                assert (want is None) == (got is None), (field, step)
                if want is not None:
                    np.testing.assert_array_equal(got, want, err_msg=f"{field} step {step} rank {rank}")
            if theirs.doc_lens is None:
                assert mine.doc_lens is None
            else:
                assert [d.tolist() for d in mine.doc_lens or []] == [d.tolist() for d in theirs.doc_lens]
    return data


def test_concat_and_chunk_default_shuffle(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NumpyDocumentSource (groups of 2 files, permuted) chunked into instances, OLMo-core's default shuffle
    (inter_source): the order file OLMo-core wrote is read and checked; rebuilt without it, the same."""
    paths = token_files(tmp_path / "tokens", n_files=5)
    dataset = [chunked([numpy_source(paths, source_group_size=2, source_permutation_seed=7)], label="web")]
    config_json, reference = run(core, tmp_path, dataset, monkeypatch)
    data = compare(config_json, reference)
    assert data.epoch_order(1).note.startswith("read from")
    assert {loc.source for loc in data.locate(range(len(data.dataset)))} == {"web"}
    rebuilt = open_olmo_core(config_json, work_dir=str(tmp_path / "elsewhere"))
    assert rebuilt.epoch_order(2).note.startswith("rebuilt")
    np.testing.assert_array_equal(rebuilt.batch(3).tokens, data.batch(3).tokens)


@pytest.mark.parametrize("strategy", ["intra_source", "interleaved_source", None])
def test_shuffle_strategies(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str | None) -> None:
    """Two instance sources of different sizes, each strategy (None: shuffle false, the instances in turn); the
    second source's token files carry label masks, so the batches' label masks are compared too... for a run
    whose instances all have them (a mix of masked and unmasked is refused: see the refusals)."""
    from olmo_core.data.composable import InstanceFilterConfig

    a = token_files(tmp_path / "a", n_files=2, seed=1, masks=True)
    b = token_files(tmp_path / "b", n_files=3, seed=2, masks=True)
    dataset = [
        chunked([numpy_source(a, label_mask_paths=[p.replace(".npy", ".mask.npy") for p in a])], label="a"),
        chunked([numpy_source(b, label_mask_paths=[p.replace(".npy", ".mask.npy") for p in b])], label="b"),
    ]
    kw: dict[str, Any] = {"shuffle_strategy": strategy} if strategy else {"shuffle": False}
    config_json, reference = run(
        core,
        tmp_path,
        dataset,
        monkeypatch,
        generate_doc_lengths=True,
        instance_filter_config=InstanceFilterConfig(repetition_max_period=2, repetition_max_count=2),
        **kw,
    )
    data = compare(config_json, reference)
    assert data.batch(1).label_mask is not None and data.batch(1).doc_lens is not None


def test_sources_per_epoch_and_chunks(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sources_per_epoch 1 over two sources of different sizes (a curriculum: epoch 1 reads the first, epoch 2
    the second, epoch 3 the first again), max_sequence_length 2L (runs of two instances kept together), a BOS
    id: our instance numbers count both sources, so epoch 2's are OLMo-core's index plus the first's size."""
    a = token_files(tmp_path / "a", n_files=2, seed=3, bos=2)
    b = token_files(tmp_path / "b", n_files=4, seed=4, bos=2)
    src = [numpy_source(p, tokenizer=tokenizer(bos=2)) for p in (a, b)]
    dataset = [chunked([s], max_sequence_length=2 * L) for s in src]
    config_json, reference = run(
        core, tmp_path, dataset, monkeypatch, sources_per_epoch=1, bos=2, generate_doc_lengths=True
    )
    data = open_olmo_core(config_json)
    first = len(data.dataset.loader.sources[0])
    compare(config_json, reference, offsets={2: first})
    sizes = [data.walk.batches_per_epoch(epoch=e) for e in (1, 2)]
    assert sizes[0] != sizes[1]
    order = data.epoch_order(1).whole()
    assert (order.reshape(-1, 2)[:, 1] - order.reshape(-1, 2)[:, 0] == 1).all()


def test_batch_size_schedule(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLMo-core's BatchSizeSchedulerCallback on a composable loader: the batch doubles at step 3."""
    from olmo_core.train import Duration

    paths = token_files(tmp_path / "tokens", n_files=4, seed=5)
    dataset = [chunked([numpy_source(paths)])]
    config_json, reference = run(
        core,
        tmp_path,
        dataset,
        monkeypatch,
        per_batch=2,
        batch_sizes=[2 * L, 4 * L],
        schedule=[Duration.steps(0), Duration.steps(3)],
    )
    compare(config_json, reference)


def test_inspect_batch_of_a_composable_run(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect-batch --json of a composable run: each rank's ids and tokens are OLMo-core's, each instance's
    file pieces are its tokens in the files, its source the loader source's label."""

    paths = token_files(tmp_path / "tokens", n_files=3, seed=9)
    dataset = [chunked([numpy_source(paths, source_group_size=-1)], label="all")]
    config_json, reference = run(core, tmp_path, dataset, monkeypatch)
    for theirs, row, inst in inspected_rows(config_json, reference, [1, len(reference[0])]):
        pieces = inst["pieces"] or [[inst["path"], inst["token_offset"], inst["token_offset"] + L]]
        read = np.concatenate([np.fromfile(p, dtype=np.uint16)[s:e] for p, s, e in pieces])
        np.testing.assert_array_equal(read, theirs.input_ids[row])
        assert inst["source"] == "all"


# -- refusals: what is not rebuilt is named by class in one line when the config is read (no OLMo-core needed)

LOADER = {
    "tokenizer": {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD},
    "global_batch_size": 4 * L,
    "seed": 0,
    "work_dir": "/tmp/w",
    "_CLASS_": "olmo_core.data.composable.data_loader.ComposableDataLoaderConfig",
}
NUMPY = {
    "tokenizer": {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD},
    "source_paths": ["/tmp/a.npy"],
    "_CLASS_": "olmo_core.data.composable.numpy_document_source.NumpyDocumentSourceConfig",
}

PACKING = "olmo_core.data.composable.packing_instance_source.PackingInstanceSourceConfig"
SAMPLING = {"sources": [NUMPY], "_CLASS_": "olmo_core.data.composable.sampling_token_source.SamplingTokenSourceConfig"}


def chunk_node(*sources: dict[str, Any], **kw: Any) -> dict[str, Any]:
    cls = "olmo_core.data.composable.concat_and_chunk_instance_source.ConcatAndChunkInstanceSourceConfig"
    return {"sources": list(sources), "sequence_length": L, "_CLASS_": cls, **kw}


@pytest.mark.parametrize(
    ("dataset", "loader", "expected"),
    [
        (
            [{"_CLASS_": "my_project.data.MySourceConfig"}],
            LOADER,
            "dataset[0] is my_project.data.MySourceConfig; not covered",
        ),
        (
            [
                chunk_node(
                    {**NUMPY, "_CLASS_": "olmo_core.data.composable.numpy_document_source.NumpyDocumentSourceMixConfig"}
                )
            ],
            LOADER,
            "dataset[0].sources[0] is OLMo-core's NumpyDocumentSourceMixConfig (a named data mix",
        ),
        ([chunk_node(NUMPY, shiny=True)], LOADER, "dataset[0].shiny is not a key of OLMo-core 3.0.0's ConcatAndChunk"),
        (
            [chunk_node(NUMPY)],
            {**LOADER, "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig"},
            "ComposableDataLoaderConfig only",
        ),
        ([chunk_node(NUMPY)], {**LOADER, "work_dir": None}, "data_loader.work_dir is None"),
        ([chunk_node(NUMPY)], {**LOADER, "shuffle_strategy": "sideways"}, "data_loader.shuffle_strategy is 'sideways'"),
        ([chunk_node(NUMPY), chunk_node(NUMPY)], {**LOADER, "sources_per_epoch": 3}, "sources_per_epoch is 3"),
        ([chunk_node(NUMPY, max_sequence_length=L + 1)], LOADER, "must be a multiple of its sequence_length"),
        ([chunk_node(NUMPY), chunk_node(NUMPY, sequence_length=2 * L)], LOADER, "different sequence_length"),
        ([chunk_node({**NUMPY, "source_group_size": 0})], LOADER, "source_group_size is 0"),
        ([chunk_node(NUMPY)], {**LOADER, "global_batch_size": L + 1}, "a multiple of the sources' sequence_length"),
        (
            [{**chunk_node(NUMPY), "_CLASS_": PACKING, "sequence_length": 24, "tokenizer": NUMPY["tokenizer"]}],
            LOADER,
            "a power of two",
        ),
        ([chunk_node({**SAMPLING, "max_tokens": 10, "factor": 0.5})], LOADER, "gives ['max_tokens', 'factor']"),
        ([chunk_node({**SAMPLING, "sources": [NUMPY], "max_tokens": 0})], LOADER, "max_tokens is 0"),
        ([chunk_node(NUMPY)], {**LOADER, "shuffle": False, "shuffle_strategy": "intra_source"}, "with shuffle false"),
    ],
)
def test_refusals_at_config_read(dataset: list[Any], loader: dict[str, Any], expected: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"dataset": dataset, "data_loader": loader, "trainer": {}}))
    with pytest.raises(DataError) as e:
        open_olmo_core(str(path))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_mixed_label_masks_refused(tmp_path: Path) -> None:
    """Instance sources with and without label masks in one loader: OLMo-core's collator would stack a mask of
    only some rows, so the run is refused by name when opened."""
    a = token_files(tmp_path / "a", n_files=1, seed=1, masks=True)
    masked = {**NUMPY, "source_paths": a, "label_mask_paths": [a[0].replace(".npy", ".mask.npy")]}
    path = tmp_path / "config.json"
    dataset = [chunk_node(masked), chunk_node({**NUMPY, "source_paths": a})]
    path.write_text(json.dumps({"dataset": dataset, "data_loader": {**LOADER, "work_dir": str(tmp_path)}}))
    with pytest.raises(DataError, match="with and without label masks"):
        open_olmo_core(str(path))


# -- sliced, sampling and mixing sources


def test_sliced_sources(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SplitTokenSourceConfig's first part chunked, in runs of two instances, then split at random (both halves
    of SplitInstanceSourceConfig, one seed): a slice keeps its source's label, and its instances whole chunks."""
    from olmo_core.data.composable import SplitTokenSourceConfig

    paths = token_files(tmp_path / "tokens", n_files=4, seed=21)
    tokens = SplitTokenSourceConfig(source=numpy_source(paths), ratio=0.8, idx=0)
    instances = chunked([tokens], max_sequence_length=2 * L, label="sliced")
    first, second = instances.split(0.7, seed=5)
    config_json, reference = run(core, tmp_path, [first, second], monkeypatch, shuffle_strategy="intra_source")
    data = compare(config_json, reference)
    assert {loc.source for loc in data.locate(range(len(data.dataset)))} == {"sliced"}


@pytest.mark.parametrize("kind", ["tokens", "documents", "instances"])
def test_sampling_sources(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Sampling of tokens (a token mix inside unwound, contiguous slices at drawn offsets), of documents (shuffled
    whole documents, repeated past their total) and of instances (per source, chunks of its shuffled order)."""
    from olmo_core.data.composable import (
        MixingTokenSourceConfig,
        MixingTokenSourceSpecConfig,
        SamplingDocumentSourceConfig,
        SamplingInstanceSourceConfig,
        SamplingTokenSourceConfig,
    )

    a = numpy_source(token_files(tmp_path / "a", n_files=2, seed=31, metadata=True))
    b = numpy_source(token_files(tmp_path / "b", n_files=3, seed=32, metadata=True), source_group_size=-1)
    if kind == "tokens":
        mix = MixingTokenSourceConfig(
            source_specs=[
                MixingTokenSourceSpecConfig(source=a, ratio=0.4),
                MixingTokenSourceSpecConfig(source=b, ratio=0.6),
            ],
            seed=8,
        )
        dataset = [chunked([SamplingTokenSourceConfig(sources=[mix, b], factor=0.9, seed=3)])]
    elif kind == "documents":
        dataset = [
            chunked([SamplingDocumentSourceConfig(sources=[a, b], factor=1.7, seed=11)]),
            chunked([SamplingDocumentSourceConfig(sources=[b], max_tokens=300, seed=None)]),
        ]
    else:
        sampled = SamplingInstanceSourceConfig(sources=[chunked([a]), chunked([b])], max_instances=30, seed=2)
        dataset = [sampled, SamplingInstanceSourceConfig(sources=[chunked([b])], factor=1.5, seed=None)]
    config_json, reference = run(core, tmp_path, dataset, monkeypatch)
    data = compare(config_json, reference)
    if kind == "documents":  # documents shuffled and repeated: trace, stats and build-order on such a run
        check_trace(config_json, reference, data, str(tmp_path / "b" / "part-01.npy"), "doc-32-1-3")
        check_stats_and_orders(config_json, reference, data, tmp_path)


def check_trace(config_json: str, reference: dict[int, list[Step]], data: Any, path: str, doc_id: str) -> None:
    """trace --document names each (step, rank) whose OLMo-core rows hold a 4-token run of the document (its
    ids are random: no other row holds one), and every span it reports is the document's tokens there."""
    from click.testing import CliRunner

    from olmo_cli.main import main as data_main

    with gzip.open(path[: -len(".npy")] + ".csv.gz", "rt") as meta:
        start, end = next((int(r[0]), int(r[1])) for r in (line.split(",") for line in meta) if r[2] == doc_id)
    doc = np.fromfile(path, dtype=np.uint16)[start:end].astype(np.int64)
    grams = {tuple(doc[i : i + 4]) for i in range(len(doc) - 3)}
    want = {
        (step, rank)
        for rank, steps in reference.items()
        for step, s in enumerate(steps, start=1)
        for row in s.input_ids
        if any(tuple(row[i : i + 4]) in grams for i in range(L - 3))
    }
    last = len(reference[0])
    args = ["trace", config_json, "--document", doc_id, "--steps", f"1..{last}", "--world-size", "2", "--json"]
    result = CliRunner().invoke(data_main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert want and want <= {(h["step"], h["rank"]) for h in hits}
    for h in hits:
        span = data.batch(h["step"]).tokens[h["position"]][h["instance_start"] : h["instance_end"]]
        assert len(span) and any(np.array_equal(span, doc[i : i + len(span)]) for i in range(len(doc) - len(span) + 1))


def check_stats_and_orders(config_json: str, reference: dict[int, list[Step]], data: Any, tmp_path: Path) -> None:
    """stats counts the run's instances and steps an epoch; build-order writes OLMo-core's order files (its names
    and bytes, as its loader wrote them into the work_dir), and keeps them when already there."""
    from click.testing import CliRunner

    from olmo_cli.main import main as data_main

    runner = CliRunner()
    result = runner.invoke(data_main, ["stats", config_json, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["num_instances"] == len(data.dataset) == sum(f["instances"] for f in stats["files"])
    assert stats["batches_per_epoch"] == sum(1 for s in reference[0] if s.epoch == 1)
    other = tmp_path / "built"
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3", "--destination", str(other)])
    assert result.exit_code == 0, result.output
    theirs = sorted(f for f in os.listdir(tmp_path / "work") if f.startswith("global_indices"))
    assert len(theirs) == 3 and sorted(os.listdir(other)) == theirs
    assert all((other / f).read_bytes() == (tmp_path / "work" / f).read_bytes() for f in theirs)
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3"])
    assert result.exit_code == 0 and result.output.count("(kept)") == 3, result.output


@pytest.mark.parametrize("kind", ["tokens", "documents", "instances"])
def test_mixing_sources(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Mixes to ratios (normalised when they do not sum to 1), with repetition allowed and a target size: of
    token sources, of document sources, and of instance sources nested two deep (a mix of a mix and a split)."""
    from olmo_core.data.composable import (
        MixingDocumentSourceConfig,
        MixingDocumentSourceSpecConfig,
        MixingInstanceSourceConfig,
        MixingInstanceSourceSpecConfig,
        MixingTokenSourceConfig,
        MixingTokenSourceSpecConfig,
    )

    a = numpy_source(token_files(tmp_path / "a", n_files=2, seed=41))
    b = numpy_source(token_files(tmp_path / "b", n_files=2, seed=42))
    c = numpy_source(token_files(tmp_path / "c", n_files=1, seed=43))
    if kind in ("tokens", "documents"):
        mixing, spec = (
            (MixingTokenSourceConfig, MixingTokenSourceSpecConfig)
            if kind == "tokens"
            else (MixingDocumentSourceConfig, MixingDocumentSourceSpecConfig)
        )
        mix = mixing(
            source_specs=[
                spec(source=a, ratio=0.5),
                spec(source=b, ratio=0.3, max_repetition_factor=3.0),
                spec(source=c, ratio=0.4, max_repetition_factor=2.0),
            ],
            seed=13,
            num_tokens=1200,
        )
        dataset = [
            chunked([mix]),
            chunked([mixing(source_specs=[spec(source=a, ratio=1), spec(source=c, ratio=2)], seed=None)]),
        ]
    else:
        inner = MixingInstanceSourceConfig(
            source_specs=[
                MixingInstanceSourceSpecConfig(source=chunked([a]), ratio=0.5),
                MixingInstanceSourceSpecConfig(source=chunked([b]).split(0.6, seed=4)[1], ratio=0.5),
            ],
            seed=17,
        )
        mix = MixingInstanceSourceConfig(
            source_specs=[
                MixingInstanceSourceSpecConfig(source=inner, ratio=0.7, max_repetition_factor=1.5, label="inner"),
                MixingInstanceSourceSpecConfig(source=chunked([c]), ratio=0.3, max_repetition_factor=2.0),
            ],
            seed=19,
            num_instances=24,
            label="mix",
        )
        dataset = [mix]
    config_json, reference = run(core, tmp_path, dataset, monkeypatch)
    compare(config_json, reference)


# -- packing and random sources


@pytest.mark.parametrize(("strategy", "group", "bos"), [("truncate", 1, None), ("fragment", 2, 2)])
def test_packing_source(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, group: int, bos: int | None
) -> None:
    """Documents packed whole (OBFD per group of sources), documents longer than L truncated or fragmented, label
    masks from the files (False on the padding), doc_lens of the padded rows; over numpy sources, a document
    sample (its documents are the sampled ones) and a source fragmenting its own documents (max_document_length,
    which OLMo-core 3.0.0 applies only with source_group_size -1); with a BOS id, a document ends where an EOS
    meets the BOS."""
    from olmo_core.data.composable import PackingInstanceSourceConfig, SamplingDocumentSourceConfig

    a = token_files(tmp_path / "a", n_files=3, seed=51, bos=bos, masks=True)
    b = token_files(tmp_path / "b", n_files=2, seed=52, bos=bos, masks=True)
    tok = tokenizer(bos)

    def docs(paths: list[str], **kw: Any) -> Any:
        masks = [p.replace(".npy", ".mask.npy") for p in paths]
        return numpy_source(paths, tokenizer=tok, label_mask_paths=masks, **kw)

    sample = SamplingDocumentSourceConfig(sources=[docs(b)], factor=1.3, seed=6)
    packing = PackingInstanceSourceConfig(
        sources=[docs(a), sample, docs(b, source_group_size=-1, max_document_length=12, long_doc_strategy="fragment")],
        sequence_length=L,
        tokenizer=tok,
        long_doc_strategy=strategy,
        source_group_size=group,
    )
    config_json, reference = run(core, tmp_path, [packing], monkeypatch, generate_doc_lengths=True, bos=bos)
    compare(config_json, reference)
    ids = np.concatenate([s.input_ids for s in reference[0]])
    assert (ids[:, -1] == PAD).any()  # padded instances


def test_random_source(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random instances, each from its run's seed (runs of max_sequence_length 2L cut in two), beside chunks of a
    file, interleaved; inspect-batch shows a random instance without a file."""
    from click.testing import CliRunner
    from olmo_core.data.composable import RandomInstanceSourceConfig

    from olmo_cli.main import main as data_main

    tok = tokenizer(bos=2)
    rand = RandomInstanceSourceConfig(
        tokenizer=tok, sequence_length=L, max_sequence_length=2 * L, avg_document_length=7, seed=23, num_instances=40
    )
    paths = token_files(tmp_path / "tokens", n_files=2, seed=61)
    dataset = [rand, chunked([numpy_source(paths, tokenizer=tok)], max_sequence_length=2 * L)]
    config_json, reference = run(
        core, tmp_path, dataset, monkeypatch, shuffle_strategy="interleaved_source", generate_doc_lengths=True, bos=2
    )
    compare(config_json, reference)
    args = ["inspect-batch", config_json, "--step", "1", "--json"]
    result = CliRunner().invoke(data_main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert any(i["path"] == "" for i in json.loads(result.output)["instances"])


def test_an_unreachable_mix_refused(tmp_path: Path) -> None:
    """A mix whose target size its sources cannot give within their max_repetition_factor: OLMo-core's run would
    have failed building it, so reading one is refused naming the mix."""
    a = token_files(tmp_path / "a", n_files=1, seed=71)
    spec = "olmo_core.data.composable.mixing_token_source.MixingTokenSourceSpecConfig"
    mix = {
        "source_specs": [
            {"source": {**NUMPY, "source_paths": a}, "ratio": 0.5, "_CLASS_": spec},
            {"source": {**NUMPY, "source_paths": a}, "ratio": 0.5, "_CLASS_": spec},
        ],
        "num_tokens": 10**6,
        "_CLASS_": "olmo_core.data.composable.mixing_token_source.MixingTokenSourceConfig",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"dataset": [chunk_node(mix)], "data_loader": {**LOADER, "work_dir": str(tmp_path)}}))
    with pytest.raises(DataError, match=r"dataset\[0\]\.sources\[0\]: the mix cannot reach 1,000,000"):
        open_olmo_core(str(path))


def test_truncated_documents_of_a_source_refused(tmp_path: Path) -> None:
    """max_document_length with truncate leaves gaps between a source's documents, which OLMo-core's document
    source fails on (an assertion): sampling its documents is refused when the run is opened."""
    a = token_files(tmp_path / "a", n_files=1, seed=81)
    numpy = {**NUMPY, "source_paths": a, "source_group_size": -1, "max_document_length": 4}
    sample = {**SAMPLING, "sources": [numpy], "max_tokens": 50}
    sample["_CLASS_"] = "olmo_core.data.composable.sampling_document_source.SamplingDocumentSourceConfig"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"dataset": [chunk_node(sample)], "data_loader": {**LOADER, "work_dir": str(tmp_path)}}))
    with pytest.raises(DataError, match="do not follow each other"):
        open_olmo_core(str(path))
