"""OLMo-core's NumpyVSLDataset and NumpyVSLDataLoader rebuilt (olmo_data.olmo_core.vsl*), against OLMo-core 3.0.0.

OLMo-core's real config classes build the run and write its config.json; its real dataset cuts the documents into
power-of-two pieces and its NumpyVSLDataLoader, driven as its Trainer drives it, yields the reference batches on
2 ranks into epoch 3, for every curriculum (natural, grow_p2 and grow_linear, balanced or not). Our reading of the
config.json alone must give every step's instance numbers, tokens, sequence length and fingerprint, from
OLMo-core's files in the work_dir and, without them, rebuilt (those files byte for byte). The curricula's batch
orders and the document cutting are also compared with OLMo-core's own functions over many settings. Tests that
need OLMo-core skip where it is not installed; the refusals by key run without it.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.errors import DataError
from olmo_data.olmo_core import open_olmo_core, read_olmo_core_config
from olmo_data.olmo_core.vsl import bucket_pieces, doc_indices_path
from olmo_data.olmo_core.vsl_curriculum import VSLCurriculum, batch_order
from olmo_data.olmo_core.vsl_loader import vsl_files
from tests.data.olmo_core.checks import check_written_and_kept, write_metadata

MIN, MAX = 8, 64
SEED = 4321
WORLD = 2
EOS, PAD, VOCAB = 0, 1, 2048


def token_files(folder: Path, n_files: int = 3, seed: int = 0, docs: int = 90) -> list[str]:
    """Seeded uint16 token files of EOS-ended documents 1..200 tokens long (many short: every bucket fills), and
    a tail without an EOS (no document); a tokenize-style .csv.gz beside each names the documents (for trace:
    OLMo-core finds a local file's documents by its EOS tokens)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(n_files):
        parts = []
        for _ in range(docs):
            n = int(rng.choice([rng.integers(1, 16), rng.integers(16, 64), rng.integers(64, 200)], p=[0.5, 0.35, 0.15]))
            parts.append(np.append(rng.integers(2, VOCAB, size=n).astype(np.uint16), np.uint16(EOS)))
        parts.append(rng.integers(2, VOCAB, size=int(rng.integers(1, 30))).astype(np.uint16))
        out.append(str(folder / f"part-{f:02d}.npy"))
        np.concatenate(parts).tofile(out[-1])
        write_metadata(out[-1], [len(d) for d in parts[:-1]], f"doc-{f}", f"src-{f}.jsonl")
    return out


def vsl_config(core: Any, tmp_path: Path, paths: list[str], curriculum: Any, gbs: int, **loader: Any) -> Any:
    """OLMo-core's ExperimentConfig of a VSL run, as its training scripts build one."""
    from olmo_core.data import NumpyDataLoaderConfig, NumpyVSLDatasetConfig
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.script_utils import ExperimentConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    dataset = NumpyVSLDatasetConfig(
        tokenizer=core.tokenizer_config(),
        paths=paths,
        max_sequence_length=MAX,
        min_sequence_length=MIN,
        vsl_curriculum=curriculum,
    )
    return ExperimentConfig(
        model=TransformerConfig.llama_like(d_model=32, vocab_size=VOCAB, n_layers=1, n_heads=2),
        dataset=dataset,
        data_loader=NumpyDataLoaderConfig(global_batch_size=gbs, seed=SEED, work_dir=str(tmp_path / "work"), **loader),
        train_module=TransformerTrainModuleConfig(
            rank_microbatch_size=gbs, max_sequence_length=MAX, optim=AdamWConfig(lr=1e-3)
        ),
        trainer=TrainerConfig(save_folder=str(tmp_path / "save"), max_duration=Duration.epochs(3)),
    )


def curriculum_config(name: str, cycles: int | None = None, balanced: bool | None = None) -> Any:
    from olmo_core.data.numpy_dataset import VSLCurriculumConfig, VSLCurriculumType

    return VSLCurriculumConfig(name=VSLCurriculumType(name), num_cycles=cycles, balanced=balanced)


def global_rows(reference: dict[int, list[Any]], step: int, field: str) -> np.ndarray:
    """A VSL step's global batch: rank r held the r-th block of W."""
    return np.concatenate([getattr(reference[r][step - 1], field) for r in range(WORLD)])


def compare(data: Any, reference: dict[int, list[Any]]) -> None:
    """Every step, every rank: instance numbers, tokens (their length), epoch, fingerprint."""
    for step in range(1, len(reference[0]) + 1):
        ours = data.batch(step)
        theirs = reference[0][step - 1]
        np.testing.assert_array_equal(ours.instances, global_rows(reference, step, "index"), err_msg=str(step))
        assert ours.epoch == theirs.epoch and ours.sequence_length == theirs.input_ids.shape[1]
        assert ours.global_batch_tokens == ours.tokens.size == data.run.global_batch_size
        assert ours.fingerprint == batch_fingerprint(global_rows(reference, step, "input_ids"))
        assert ours.label_mask is None and theirs.label_mask is None
        for rank in range(WORLD):
            mine, theirs = data.batch(step, rank, WORLD), reference[rank][step - 1]
            np.testing.assert_array_equal(mine.rank_instances, theirs.index, err_msg=f"step {step} rank {rank}")
            np.testing.assert_array_equal(mine.tokens, theirs.input_ids, err_msg=f"step {step} rank {rank}")
    last = len(reference[0])
    for instance in global_rows(reference, last, "index")[::3].tolist():  # the steps and ranks that trained it
        want = sorted((s.step, r) for r in range(WORLD) for s in reference[r] if instance in s.index)
        assert sorted((t.step, t.rank) for t in data.steps_of(instance, last, WORLD)) == want


def their_files(work: Path) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(work):
        for name in names:
            if name.endswith(".npy"):
                full = Path(root) / name
                out[str(full.relative_to(work))] = full.read_bytes()
    return out


def run_and_compare(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any) -> tuple[str, Any]:
    """OLMo-core's loader into epoch 3; ours from its files and rebuilt without them (those, byte for byte)."""
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    rebuilt = open_olmo_core(config_json, work_dir=str(tmp_path / "not-yet"))
    per_epoch = rebuilt.walk.batches_per_epoch()
    last = 2 * per_epoch + 3
    reference = core.drive_loader(config, world_size=WORLD, last_step=last, monkeypatch=monkeypatch)
    assert len(reference[0]) == last and reference[0][-1].epoch == 3
    assert {s.input_ids.shape[1] for s in reference[0]} == {8, 16, 32, 64}  # every bucket trained
    data = open_olmo_core(config_json)
    assert all(
        note.startswith(("bucketed-doc-indices: read", "instance-lengths: read", "bucket indices: read"))
        for note in data.dataset.vsl.notes
    )
    assert all("rebuilt" in note for note in rebuilt.dataset.vsl.notes)
    assert data.epoch_order(2).note.startswith("read from") and rebuilt.epoch_order(2).note.startswith("rebuilt")
    built = config.dataset.build()
    built.work_dir = str(tmp_path / "work")
    assert data.dataset.vsl.fingerprint == built.fingerprint and len(data.dataset) == len(built)
    compare(data, reference)
    compare(rebuilt, reference)
    # our files, under OLMo-core's names in its work_dir layout, are its files byte for byte
    theirs = their_files(tmp_path / "work")
    ours = {
        os.path.relpath(p, tmp_path / "mine"): b
        for p, b, _ in vsl_files(rebuilt.walk, range(1, 4), str(tmp_path / "mine"))
    }
    assert ours.keys() == theirs.keys() and all(ours[k] == theirs[k] for k in ours), sorted(ours.keys() ^ theirs.keys())
    return config_json, reference


@pytest.mark.parametrize(
    ("name", "cycles", "balanced", "gbs", "threads"),
    [
        ("natural", None, None, 8 * MAX, None),  # OLMo-core's default: 4 threads, a rank's first batch of 4
        ("grow_p2", 2, False, 4 * MAX, 2),
        ("grow_linear", 3, True, 4 * MAX, 1),
        ("grow_p2", 4, True, 4 * MAX, 0),
        ("grow_linear", 4, False, 4 * MAX, 2),
    ],
)
def test_vsl_every_step_on_two_ranks(
    core: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    cycles: int | None,
    balanced: bool | None,
    gbs: int,
    threads: int | None,
) -> None:
    paths = token_files(tmp_path / "tokens", seed=len(name))
    config = vsl_config(core, tmp_path, paths, curriculum_config(name, cycles, balanced), gbs, num_threads=threads)
    config_json, reference = run_and_compare(core, tmp_path, monkeypatch, config)
    if name == "natural":
        check_commands(config_json, reference, tmp_path)


def check_commands(config_json: str, reference: dict[int, list[Any]], tmp_path: Path) -> None:
    """stats counts OLMo-core's instances, buckets and batches; build-order writes OLMo-core's files (kept when
    identical); inspect-batch gives a step's global batch (a step of each bucket length)."""
    runner = CliRunner()
    result = runner.invoke(data_main, ["stats", config_json, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    data = open_olmo_core(config_json)
    assert stats["num_instances"] == len(data.dataset)
    assert stats["batches_per_epoch"] == sum(1 for s in reference[0] if s.epoch == 1)
    assert [b["length"] for b in stats["buckets"]] == [8, 16, 32, 64]
    assert stats["instance_tokens"] == sum(b["length"] * b["instances"] for b in stats["buckets"])
    work = tmp_path / "work"
    check_written_and_kept(config_json, work, tmp_path / "built", their_files(work), their_files)
    check_trace(config_json, reference, data, tmp_path / "work")
    lengths: dict[int, int] = {}
    for s in reference[0]:
        lengths.setdefault(s.input_ids.shape[1], s.step)
    for step in sorted(lengths.values()):
        result = runner.invoke(data_main, ["inspect-batch", config_json, "--step", str(step), "--json"])
        assert result.exit_code == 0, result.output
        got = json.loads(result.output)
        assert [i["instance"] for i in got["instances"]] == global_rows(reference, step, "index").tolist()
        for inst, row in zip(got["instances"], global_rows(reference, step, "input_ids"), strict=True):
            np.testing.assert_array_equal(inst["token_ids"], row)


def check_trace(config_json: str, reference: dict[int, list[Any]], data: Any, work: Path) -> None:
    """trace --document names exactly the steps whose OLMo-core batches held one of its pieces, by OLMo-core's
    own bucketed document indices (which instance is which tokens of the file)."""
    path = data.dataset.paths[1]
    n = os.path.getsize(path)
    stored = Path(doc_indices_path(data.run, path, n)).relative_to(data.run.dataset_work_dir)
    pieces = np.fromfile(work / stored, dtype=np.uint32).astype(np.int64).reshape(-1, 2)
    first = int(data.dataset.vsl.offsets[1])
    with gzip.open(path[: -len(".npy")] + ".csv.gz", "rt") as meta:
        rows = [line.split(",") for line in meta]
    doc_id, a, b = next((r[2], int(r[0]), int(r[1])) for r in rows if int(r[1]) - int(r[0]) > 2 * MAX)
    holding = {first + j for j, (lo, hi) in enumerate(pieces.tolist()) if lo < b and hi > a}
    last = reference[0][-1].step
    want = sorted({s.step for r in range(WORLD) for s in reference[r] if holding & set(s.index.tolist())})
    args = ["trace", config_json, "--document", doc_id, "--steps", f"1..{last}", "--json"]
    result = CliRunner().invoke(data_main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert sorted({h["step"] for h in hits}) == want and want
    assert {h["instance"] for h in hits} == holding


def test_trace_ranks_of_a_vsl_run(tmp_path: Path) -> None:
    """trace --world-size names the rank of each hit as OLMo-core's VSL loader split the batch (OlmoCoreData's
    steps_of, tested against OLMo-core above)."""
    config = minimal(tmp_path, num_threads=0)
    config["trainer"] = {"max_duration": {"value": 2, "unit": "epochs"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    data = open_olmo_core(str(path))
    args = ["trace", str(path), "--document", "doc-0-60", "--world-size", "2", "--json"]
    result = CliRunner().invoke(data_main, args)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert hits
    for h in hits:
        assert (h["step"], h["rank"]) in {(t.step, t.rank) for t in data.steps_of(h["instance"], 8, WORLD)}


def test_inspect_batch_of_a_rank_of_a_vsl_run(tmp_path: Path) -> None:
    """inspect-batch --rank r of a VSL run shows the r-th block of the batch, as OLMo-core's VSL loader gives
    it (OlmoCoreData's rank rows, tested against OLMo-core above)."""
    config = minimal(tmp_path, num_threads=0)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    data = open_olmo_core(str(path))
    for rank in range(WORLD):
        args = ["inspect-batch", str(path), "--step", "1", "--rank", str(rank), "--world-size", "2", "--json"]
        result = CliRunner().invoke(data_main, args)
        assert result.exit_code == 0, result.output
        want = data.batch(1, rank, WORLD).rank_instances.tolist()
        assert [i["instance"] for i in json.loads(result.output)["instances"]] == want


def test_vsl_over_http_reads_documents_from_the_metadata(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remote token files: OLMo-core (and we) take the documents from the .csv.gz beside each, over HTTP; its
    files are keyed by the URLs."""
    from tests.flaky_server import FlakyServer

    root = tmp_path / "www"
    paths = token_files(root, n_files=2, seed=3)
    server = FlakyServer(root)
    server._server.RequestHandlerClass.protocol_version = "HTTP/1.0"  # type: ignore[attr-defined]
    with server:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        config = vsl_config(core, tmp_path, urls, curriculum_config("grow_p2", 1, False), 4 * MAX, num_threads=1)
        run_and_compare(core, tmp_path, monkeypatch, config)


def test_vsl_threads_that_skip_instances_are_refused(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 4 threads and a rank's first batch of 2 instances, OLMo-core 3.0.0's loader starts its last thread
    after that batch is counted: it repeats rows and fails. We refuse that world size, and serve one it reads
    right."""
    paths = token_files(tmp_path / "tokens", n_files=1)
    config = vsl_config(core, tmp_path, paths, None, 4 * MAX)
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    with pytest.raises(RuntimeError):  # its loader, as its Trainer drives it, fails
        core.drive_loader(config, world_size=WORLD, last_step=20, monkeypatch=monkeypatch)
    data = open_olmo_core(config_json)
    with pytest.raises(DataError, match="reads instances in 4 threads .* fewer than 3: OLMo-core 3.0.0 then repeats"):
        data.batch(1, 0, WORLD)
    assert data.batch(1, 0, 1).tokens.shape == (4, MAX)  # one rank: its 4 instances start every thread


def test_a_curriculum_olmo_core_fails_on_is_refused(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """grow_linear over 2 cycles rounds a cycle's 9 batches of the longest bucket to 10 over its sub-cycles:
    OLMo-core's loader fails building the order; we refuse the run when it is opened, saying why."""
    paths = token_files(tmp_path / "tokens", seed=len("grow_linear"))
    config = vsl_config(core, tmp_path, paths, curriculum_config("grow_linear", 2, False), 4 * MAX, num_threads=2)
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    with pytest.raises(AssertionError):
        core.drive_loader(config, world_size=WORLD, last_step=1, monkeypatch=monkeypatch)
    with pytest.raises(
        DataError, match="rounds bucket 64's 9 batches of cycle 0 to 10 .* OLMo-core's curriculum fails"
    ):
        open_olmo_core(config_json)


def test_growth_curricula_order_batches_as_olmo_core(core: Any) -> None:
    """Our batch orders are OLMo-core's curricula's, over bucket counts, cycles and balancing."""
    from olmo_core.data.numpy_dataset import VSLGrowLinearCurriculum, VSLGrowP2Curriculum, VSLNaturalCurriculum

    rng = np.random.default_rng(0)
    classes = {"grow_p2": VSLGrowP2Curriculum, "grow_linear": VSLGrowLinearCurriculum}
    checked = 0
    for trial in range(60):
        buckets = int(rng.integers(2, 6))
        per_bucket = [(8 << k, int(rng.integers(0, 60))) for k in range(buckets)]
        per_bucket[-1] = (per_bucket[-1][0], int(rng.integers(1, 60)))
        seed = int(rng.integers(0, 1000))
        name = ["natural", "grow_p2", "grow_linear"][trial % 3]
        if name == "natural":
            theirs = VSLNaturalCurriculum().get_batch_indices(per_bucket, seed)
            ours = batch_order(VSLCurriculum(), per_bucket, seed, "test")
        else:
            cycles, balanced = int(rng.integers(1, 5)), bool(rng.integers(0, 2))
            cut = [(length, cycles * (n // cycles)) for length, n in per_bucket]
            if balanced:
                fewest = min(n for _, n in cut)
                cut = [(length, fewest) for length, _ in cut]
            try:
                theirs = classes[name](num_cycles=cycles, balanced=balanced).get_batch_indices(cut, seed)
            except (AssertionError, ValueError):  # OLMo-core fails (its rounding over sub-cycles, no batch at all)
                with pytest.raises(DataError, match="fails on that|would train nothing"):
                    batch_order(VSLCurriculum(name, cycles, balanced), cut, seed, "test")
                continue
            ours = batch_order(VSLCurriculum(name, cycles, balanced), cut, seed, "test")
        np.testing.assert_array_equal(ours, theirs, err_msg=f"trial {trial} {name}")
        checked += 1
    assert checked > 40


def test_documents_are_cut_as_olmo_core_cuts_them(core: Any, tmp_path: Path) -> None:
    """bucket_pieces equals OLMo-core's bucket_documents (its powers of two, capped, the remainder dropped)."""
    from olmo_core.data.utils import bucket_documents

    rng = np.random.default_rng(1)
    tokens = rng.integers(2, VOCAB, size=20_000).astype(np.uint16)
    tokens[np.sort(rng.choice(20_000, size=120, replace=False))] = EOS
    path = tmp_path / "t.npy"
    tokens.tofile(path)
    ends = np.flatnonzero(tokens == EOS) + 1
    docs = np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)
    for lo, hi in ((1, 64), (8, 64), (16, 256), (32, 32 << 4)):
        target = tmp_path / f"pieces-{lo}-{hi}.npy"
        lengths = [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]
        bucket_documents(path, target, buckets=lengths, eos_token_id=EOS, dtype=np.uint16)
        theirs = np.fromfile(target, dtype=np.uint32).reshape(-1, 2)
        np.testing.assert_array_equal(bucket_pieces(docs, lo, hi), theirs)


def minimal(tmp_path: Path, dataset: dict[str, Any] | None = None, **loader: Any) -> dict[str, Any]:
    paths = token_files(tmp_path / "tokens", n_files=1)
    return {
        "dataset": {
            "_CLASS_": "olmo_core.data.numpy_dataset.NumpyVSLDatasetConfig",
            "paths": paths,
            "max_sequence_length": MAX,
            "min_sequence_length": MIN,
            "tokenizer": {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD},
            **(dataset or {}),
        },
        "data_loader": {
            "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
            "global_batch_size": 8 * MAX,
            "seed": 1,
            "work_dir": str(tmp_path / "work"),
            **loader,
        },
    }


@pytest.mark.parametrize(
    ("dataset", "loader", "message"),
    [
        ({"max_sequence_length": 48}, {}, "dataset.max_sequence_length is 48; OLMo-core's VSL dataset needs a power"),
        ({"min_sequence_length": 64}, {}, "min_sequence_length 64 is not below its max_sequence_length 64"),
        ({"sequence_length": 64}, {}, "dataset.sequence_length is not a key of OLMo-core's NumpyVSLDatasetConfig"),
        ({"label_mask_paths": ["m.npy"]}, {}, "dataset.label_mask_paths is not a key"),
        ({"tokenizer": {"vocab_size": VOCAB, "eos_token_id": 0, "pad_token_id": 1, "bos_token_id": 2}}, {}, "BOS id"),
        ({"vsl_curriculum": {"name": "grow_p2"}}, {}, "needs num_cycles and balanced"),
        ({"vsl_curriculum": {"name": "grow_x"}}, {}, "dataset.vsl_curriculum.name is 'grow_x'"),
        ({"vsl_curriculum": {"name": "grow_p2", "num_cycles": 0, "balanced": False}}, {}, "num_cycles is 0"),
        ({}, {"global_batch_size": 96}, "(96 tokens) is not a multiple of dataset.max_sequence_length (64)"),
        ({}, {"num_threads": -1}, "data_loader.num_threads is -1"),
    ],
)
def test_vsl_refusals_name_the_key(
    tmp_path: Path, dataset: dict[str, Any], loader: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError) as e:
        read_olmo_core_config(minimal(tmp_path, dataset, **loader))
    assert message in str(e.value)


def test_vsl_runs_olmo_core_fails_are_refused(tmp_path: Path) -> None:
    """A batch-size schedule (OLMo-core's VSL loader keeps its first size's counts), an empty bucket (a longest
    bucket of 256 tokens is always empty: OLMo-core stores lengths as uint8) and more ranks than a batch of the
    longest bucket has instances, each refused in one line."""
    config = minimal(tmp_path)
    config["trainer"] = {
        "callbacks": {
            "bs": {
                "_CLASS_": "olmo_core.train.callbacks.BatchSizeSchedulerCallback",
                "batch_sizes": [8 * MAX, 16 * MAX],
                "schedule": [{"value": 0, "unit": "steps"}, {"value": 4, "unit": "steps"}],
            }
        }
    }
    with pytest.raises(DataError, match="BatchSizeSchedulerCallback with NumpyVSLDatasetConfig: not covered"):
        read_olmo_core_config(config)
    with pytest.raises(DataError, match="bucket 256 holds no instance .*uint8, where 256 is 0"):
        open_olmo_core(minimal(tmp_path, {"max_sequence_length": 256}, global_batch_size=1024))
    data = open_olmo_core(minimal(tmp_path, num_threads=0))
    with pytest.raises(DataError, match="cannot be split over 16 ranks"):
        data.batch(1, 0, 16)
