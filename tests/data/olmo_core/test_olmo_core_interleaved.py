"""OLMo-core's NumpyInterleavedFSLDataset rebuilt (olmo_data.olmo_core.interleaved), against OLMo-core 3.0.0 itself;
and its instance filter with the interleaved and the packed datasets.

OLMo-core's real config classes build the run and write its config.json; its real dataset interleaves the
documents and its NumpyFSLDataLoader, driven as its Trainer drives it, yields the reference batches on 2 ranks
over epochs 1 to 3. Our reading of the config.json alone must give every step's instance numbers, tokens, label
masks and instance masks, from OLMo-core's files in the work_dir and, without them, rebuilt (those files byte for
byte). The token files are small and seeded: documents shorter and longer than an instance, some repeating a short
sequence (the filter's case), some holding a pad id inside (OLMo-core drops it), a tail after the last EOS.
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
from olmo_data.olmo_core.interleaved import EXEMPT, INTERLEAVABLE, dataset_fingerprint
from tests.data.olmo_core.checks import check_written_and_kept, inspected_rows, write_metadata
from tests.olmo_core_commands import chosen_steps

L = 64
SEED = 4321
WORLD = 2
EOS, PAD, BOS, VOCAB = 0, 1, 2, 2048


def token_files(folder: Path, n_files: int = 4, seed: int = 0, bos: int | None = None) -> list[str]:
    """Seeded uint16 token files of documents 1..150 tokens long, each ended by EOS, and a tail without one; with
    `bos`, each document starts with it. A tokenize-style .csv.gz beside each names its documents (for trace)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(n_files):
        docs = []
        for _ in range(int(rng.integers(16, 28))):
            n = int(rng.choice([rng.integers(1, 20), rng.integers(20, 64), rng.integers(64, 150)], p=[0.35, 0.5, 0.15]))
            body = rng.integers(3, VOCAB, size=n).astype(np.uint16)
            if rng.random() < 0.2:  # a short sequence repeated: the instance filter's case
                body = np.resize(rng.integers(3, VOCAB, size=int(rng.integers(1, 4))), n).astype(np.uint16)
            elif n > 50 and rng.random() < 0.5:  # repeated past the first L / 2 only: judged on the whole document
                body[34:] = np.resize(rng.integers(3, VOCAB, size=2), n - 34)
            if n > 4 and rng.random() < 0.2:
                body[int(rng.integers(1, n - 1))] = PAD  # removed by OLMo-core's interleaving, wherever it is
            if bos is not None:
                body[0] = bos
            docs.append(np.append(body, np.uint16(EOS)))
        docs.append(rng.integers(3, VOCAB, size=int(rng.integers(1, 10))).astype(np.uint16))  # no EOS: no document
        out.append(str(folder / f"part-{f:02d}.npy"))
        np.concatenate(docs).tofile(out[-1])
        write_metadata(out[-1], [len(d) for d in docs[:-1]], f"doc-{f}", f"src-{f}.jsonl")
    return out


def drive(core: Any, tmp_path: Path, dataset: Any, monkeypatch: pytest.MonkeyPatch, per_batch: int = 8) -> Any:
    """OLMo-core's loader over the run into epoch 3 on WORLD ranks: (config.json, reference, rebuilt data)."""
    config = core.experiment_config(
        dataset, global_batch_size=per_batch * L, seed=SEED, work_dir=str(tmp_path / "work"), save_folder=str(tmp_path)
    )
    config_json = core.save_config_json(config, tmp_path / "step0")
    rebuilt = open_olmo_core(config_json, work_dir=str(tmp_path / "not-yet"))  # OLMo-core has written nothing yet
    last = 2 * (len(rebuilt.dataset) // per_batch) + 2  # two whole epochs, then into the third
    reference = core.drive_loader(config, world_size=WORLD, last_step=last, monkeypatch=monkeypatch)
    assert len(reference[0]) == last and reference[0][-1].epoch == 3
    return config_json, config, reference, rebuilt


def compare(data: Any, reference: dict[int, list[Any]], core: Any) -> None:
    """Every step, every rank: instance numbers, tokens, label masks and instance masks equal; fingerprints too."""
    for step in range(1, len(reference[0]) + 1):
        ours = data.batch(step)
        np.testing.assert_array_equal(ours.instances, core.global_rows(reference, step, "index"), err_msg=str(step))
        assert ours.epoch == reference[0][step - 1].epoch
        assert ours.fingerprint == batch_fingerprint(core.global_rows(reference, step, "input_ids"))
        for rank in range(WORLD):
            mine, theirs = data.batch(step, rank, WORLD), reference[rank][step - 1]
            np.testing.assert_array_equal(mine.tokens, theirs.input_ids, err_msg=f"step {step} rank {rank}")
            np.testing.assert_array_equal(mine.label_mask, theirs.label_mask, err_msg=f"step {step} rank {rank}")
            if theirs.instance_mask is None:
                assert mine.instance_mask is None
            else:
                np.testing.assert_array_equal(mine.instance_mask, theirs.instance_mask, err_msg=f"step {step}")
            assert mine.doc_lens is None


def their_dataset(config: Any, work_dir: Path) -> Any:
    """OLMo-core's dataset of the run, over the files its loader wrote (for its length, fingerprint, items)."""
    dataset = config.dataset.build()
    dataset.work_dir = work_dir
    dataset.prepare()
    return dataset


def their_files(work_dir: Path) -> dict[str, bytes]:
    """OLMo-core's instance-indices and interleaving files in a work_dir, by their path there."""
    out = {}
    for root, _, names in os.walk(work_dir):
        for name in names:
            if name.startswith("instance-indices") or name in (INTERLEAVABLE, EXEMPT):
                path = Path(root, name)
                out[str(path.relative_to(work_dir))] = path.read_bytes()
    return out


@pytest.mark.parametrize(
    ("docs", "chunks", "bos", "exempt", "masks"),
    [(2, 4, None, False, False), (4, 2, BOS, True, True)],
)
def test_interleaved_every_step_on_two_ranks(
    core: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    docs: int,
    chunks: int,
    bos: int | None,
    exempt: bool,
    masks: bool,
) -> None:
    """Two or four documents an instance, in four or two chunks each; with a BOS id, label mask files, an
    interleaving-exempt file, OLMo-core's source_permutation_seed and instance filter: read from OLMo-core's
    files in the work_dir, and rebuilt without them, every batch equal; our files are OLMo-core's, byte for byte."""
    from olmo_core.data import NumpyInterleavedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    paths = token_files(tmp_path / "tokens", seed=docs, bos=bos)
    mask_paths = None
    if masks:
        rng = np.random.default_rng(1)
        mask_paths = [p + ".mask" for p in paths]
        for p, m in zip(paths, mask_paths, strict=True):
            (rng.random(os.path.getsize(p) // 2) < 0.7).tofile(m)
    tokenizer = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=bos)
    dataset = NumpyInterleavedFSLDatasetConfig(
        tokenizer=tokenizer,
        paths=paths,
        sequence_length=L,
        docs_per_instance=docs,
        chunks_per_doc=chunks,
        seed=77,
        label_mask_paths=mask_paths,
        interleaving_exempt_paths=[paths[1]] if exempt else None,
        source_permutation_seed=5,
        instance_filter_config=InstanceFilterConfig(repetition_max_count=4),
    )
    config_json, config, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    data = open_olmo_core(config_json)
    assert data.run.kind == "interleaved" and data.dataset.interleaved.note.startswith("read from")
    assert rebuilt.dataset.interleaved.note.startswith("rebuilt")
    theirs = their_dataset(config, tmp_path / "work")
    assert len(theirs) == len(data.dataset) == len(rebuilt.dataset)
    sizes = [os.path.getsize(p) for p in data.dataset.paths]
    assert dataset_fingerprint(data.run, data.dataset.paths, sizes) == theirs.fingerprint
    assert len(data.dataset.interleaved.exempt) == (theirs._num_interleaving_exempt_instances or 0)
    compare(data, reference, core)
    compare(rebuilt, reference, core)
    kept = np.concatenate([s.instance_mask for s in reference[0]])
    assert kept.any() and not kept.all()  # the filter dropped some instances, judged by their documents
    ids = np.concatenate([s.input_ids for s in reference[0]])
    assert (ids == PAD).any(axis=1).any()  # padded instances; without a BOS (dropped in every document), full ones
    assert (ids[:, 0] == bos).any() if bos is not None else (ids != PAD).all(axis=1).any()
    for index in range(len(theirs)):  # every instance, each as OLMo-core's dataset gives it
        item = theirs[index]
        tokens, mask = data.dataset.get_batch([index])
        np.testing.assert_array_equal(tokens[0], item["input_ids"].numpy(), err_msg=str(index))
        np.testing.assert_array_equal(mask[0], item["label_mask"].numpy(), err_msg=str(index))
        loc = data.locate([index])[0]  # each run of file tokens is where the instance holds it
        if index >= len(data.dataset.interleaved.exempt):  # its pad ids all padding: its length is before them
            assert loc.length == len(np.trim_zeros(tokens[0] != PAD, "b")), index
        for (path, s, e), at in zip(loc.pieces, loc.at or [0] * len(loc.pieces), strict=True):
            np.testing.assert_array_equal(tokens[0][at : at + e - s], np.fromfile(path, dtype=np.uint16)[s:e])
    check_files(config_json, tmp_path, their_files(tmp_path / "work"))
    check_commands(config_json, reference, bos)
    check_trace(config_json, reference, data, tmp_path / "work")


def check_files(config_json: str, tmp_path: Path, theirs: dict[str, bytes]) -> None:
    """build-order writes the orders and OLMo-core's instance-indices and interleaving files under its names and
    bytes; in the run's own work_dir, OLMo-core's are recognised as identical and kept; a changed one refused."""
    other = tmp_path / "built"
    assert any(name.endswith(INTERLEAVABLE) for name in theirs)
    assert sum(f.startswith("global_indices") for f in os.listdir(tmp_path / "work")) == 3
    check_written_and_kept(config_json, tmp_path / "work", other, theirs, their_files)
    name = next(n for n in theirs if n.endswith(INTERLEAVABLE))
    (other / name).write_bytes(theirs[name][4:] + theirs[name][:4])  # the same numbers, in another order
    result = CliRunner().invoke(data_main, ["build-order", config_json, "--destination", str(other)])
    assert result.exit_code != 0 and "not the interleaving OLMo-core writes" in result.output


def check_commands(config_json: str, reference: dict[int, list[Any]], bos: int | None) -> None:
    """inspect-batch --json at the first step of epochs 1 and 2 and the last step, each rank: ids and tokens equal
    OLMo-core's, each instance's pieces its tokens in the files, in order; stats counts OLMo-core's instances."""
    runner = CliRunner()
    steps = reference[0]
    exempt = len(open_olmo_core(config_json).dataset.interleaved.exempt)  # whole documents: no BOS added
    for theirs, row, inst in inspected_rows(config_json, reference, chosen_steps(reference)):
        read = [np.fromfile(p, dtype=np.uint16)[s:e] for p, s, e in inst["pieces"]]
        lead = int(bos is not None and inst["instance"] >= exempt and theirs.input_ids[row][0] == bos)
        taken = np.concatenate(read)
        np.testing.assert_array_equal(taken, theirs.input_ids[row][lead : lead + len(taken)])
        for d in inst["documents"] or []:  # each document's tokens where the report places them
            k = max(i for i, at in enumerate(inst["piece_positions"]) if at <= d["instance_start"])
            n, first = d["instance_end"] - d["instance_start"], d["start"] + d["document_start"]
            want = np.fromfile(inst["pieces"][k][0], dtype=np.uint16)[first : first + n]
            np.testing.assert_array_equal(theirs.input_ids[row][d["instance_start"] :][:n], want)
    result = runner.invoke(data_main, ["stats", config_json, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["trainer"] == "olmo-core" and stats["num_instances"] == len(open_olmo_core(config_json).dataset)
    assert stats["batches_per_epoch"] == sum(1 for s in steps if s.epoch == 1)
    assert sum(f["instances"] for f in stats["files"]) == stats["num_instances"]
    assert stats["dataset_files"][0].startswith("interleaving: read from")
    assert all(f["dropped_tokens"] > 0 for f in stats["files"])  # every file has a tail after its last EOS
    # the tokens its instances read, by OLMo-core's files: each exempt document's, the first L / D of each
    # interleaved one's, none of one left over
    inter = open_olmo_core(config_json).dataset.interleaved
    lengths = np.concatenate(
        [np.diff(np.fromfile(f, dtype="<u4").astype(np.int64).reshape(-1, 2)) for f in inter.index_files]
    )
    folder = Path(inter.folder)
    order = np.fromfile(folder / INTERLEAVABLE, dtype="<u4").astype(np.int64)
    exempt_docs = np.fromfile(folder / EXEMPT, dtype="<u4").astype(np.int64) if (folder / EXEMPT).is_file() else []
    d = inter.spec.docs_per_instance
    used = order[: len(order) // d * d]
    held = int(lengths[exempt_docs].sum()) + int(np.minimum(lengths[used], L // d).sum())
    assert sum(f["tokens"] - f["dropped_tokens"] for f in stats["files"]) == held


def check_trace(config_json: str, reference: dict[int, list[Any]], data: Any, work_dir: Path) -> None:
    """trace --document and --tokens name exactly the (step, rank) pairs whose OLMo-core batches held the
    document, found by OLMo-core's own files (its documents and their interleaving); each hit's span of the
    instance is the document's tokens there."""
    inter = data.dataset.interleaved
    last = reference[0][-1]
    instance = int(last.index[0])
    # the instance's first document by OLMo-core's files: exempt ones first, then the interleaving's D at a time
    folder = Path(inter.folder)
    exempt = np.fromfile(folder / EXEMPT, dtype="<u4") if (folder / EXEMPT).is_file() else np.zeros(0, np.uint32)
    order = np.fromfile(folder / INTERLEAVABLE, dtype="<u4")
    d = data.run.interleaving.docs_per_instance
    doc = int(exempt[instance]) if instance < len(exempt) else int(order[(instance - len(exempt)) * d])
    counts = [os.path.getsize(p) // 8 for p in inter.index_files]
    k = int(np.searchsorted(np.cumsum(counts), doc, side="right"))
    spans = np.fromfile(inter.index_files[k], dtype="<u4").astype(np.int64).reshape(-1, 2)
    start, end = spans[doc - sum(counts[:k])]
    path = data.dataset.paths[k]
    with gzip.open(path[: -len(".npy")] + ".csv.gz", "rt") as meta:
        doc_id = next(r.split(",")[2] for r in meta if int(r.split(",")[0]) == start)
    holders = {instance}  # the instances reading the document: its own (a file is listed once in this dataset)
    want = sorted({(s.step, r) for r, got in reference.items() for s in got if holders & set(s.index.tolist())})
    tokens = np.fromfile(path, dtype=np.uint16)[start:end]
    body = [t for t in tokens.tolist() if t not in (EOS, PAD, BOS)][:6]
    for args in (["--document", doc_id], ["--tokens", ",".join(map(str, body))]):
        result = CliRunner().invoke(
            data_main,
            ["trace", config_json, *args, "--steps", f"1..{last.step}", "--world-size", "2", "--json"],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        hits = json.loads(result.output)["hits"]
        if args[0] == "--tokens":  # the same ids may be elsewhere too: only this document's places are checked
            hits = [h for h in hits if h["instance"] == instance]
        assert sorted({(h["step"], h["rank"]) for h in hits}) == want and want, args
        for h in hits:  # each hit's span of the instance is the document's tokens there
            row = data.batch(h["step"]).tokens[h["position"]]
            span = row[h["instance_start"] : h["instance_end"]]
            if args[0] == "--document":
                assert len(span) and np.array_equal(span, tokens[h["target_start"] : h["target_end"]])
            else:
                assert np.array_equal(span, np.array(body)[h["target_start"] : h["target_end"]])


def test_packed_instance_filter_as_olmo_core(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLMo-core's instance filter with its default settings (OLMo 3 32B's: 13, 1, 32) on packed instances: it
    judges the padded row, so an instance less than half full is dropped for its padding, and one holding a long
    repetition for that; our instance_mask equals OLMo-core's at every step, on both ranks."""
    from olmo_core.data import NumpyPackedFSLDatasetConfig
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    paths = token_files(tmp_path / "tokens", seed=11)
    dataset = NumpyPackedFSLDatasetConfig(
        tokenizer=core.tokenizer_config(),
        paths=paths,
        sequence_length=L,
        instance_filter_config=InstanceFilterConfig(),
    )
    config_json, _, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    compare(rebuilt, reference, core)
    ids = np.concatenate([s.input_ids for s in reference[0]])
    kept = np.concatenate([s.instance_mask for s in reference[0]])
    padded = (ids == PAD).sum(axis=1) > L // 2
    assert kept.any() and (~kept & padded).any() and (~kept & ~padded).any()


def minimal(tmp_path: Path, **dataset: Any) -> dict[str, Any]:
    path = token_files(tmp_path / "tokens", n_files=1)[0]
    return {
        "dataset": {
            "_CLASS_": "olmo_core.data.numpy_dataset.NumpyInterleavedFSLDatasetConfig",
            "paths": [path],
            "sequence_length": L,
            "docs_per_instance": 2,
            "chunks_per_doc": 2,
            "seed": 3,
            "tokenizer": {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD},
            **dataset,
        },
        "data_loader": {
            "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
            "global_batch_size": 4 * L,
            "seed": 1,
            "work_dir": str(tmp_path / "work"),
        },
    }


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"docs_per_instance": 3}, "dataset.docs_per_instance is 3; OLMo-core needs dataset.sequence_length (64)"),
        ({"chunks_per_doc": 0}, "dataset.chunks_per_doc is 0; expected a whole number from 1"),
        ({"seed": None}, "dataset.seed is None; expected a whole number"),
        ({"interleaving_exempt_paths": "a.npy"}, "dataset.interleaving_exempt_paths is 'a.npy'; expected a list"),
    ],
)
def test_interleaved_refusals_name_the_key(tmp_path: Path, keys: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError) as e:
        read_olmo_core_config(minimal(tmp_path, **keys))
    assert message in str(e.value)


def test_interleaved_faults_are_one_line(tmp_path: Path) -> None:
    """Exempt paths that name no dataset file (OLMo-core fails writing an empty file), and an interleaving file
    that is not these documents' permutation, each refused naming what to do."""
    with pytest.raises(DataError, match="names none of dataset.paths' documents"):
        open_olmo_core(minimal(tmp_path, interleaving_exempt_paths=["elsewhere.npy"]))
    config = minimal(tmp_path)
    data = open_olmo_core(config)
    assert data.dataset.interleaved.note.startswith("rebuilt")
    folder = Path(data.dataset.interleaved.folder)
    folder.mkdir(parents=True)
    data.dataset.interleaved.order.astype("<u4").tofile(folder / INTERLEAVABLE)
    again = open_olmo_core(config)
    assert again.dataset.interleaved.note.startswith("read from")
    assert again.batch(1).fingerprint == data.batch(1).fingerprint
    np.zeros(len(data.dataset.interleaved.order), dtype="<u4").tofile(folder / INTERLEAVABLE)
    with pytest.raises(DataError, match=f"{folder / INTERLEAVABLE}: not OLMo-core's interleaving .* remove"):
        open_olmo_core(config)


def test_interleaved_trace_spans_of_real_text(
    core: Any, demo_token_parts: list[str], demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trace --spans of a text one interleaved chunk holds (real text, the demo tokenizer): its place in the token
    file, trained at exactly the steps whose OLMo-core batches held the instance, at the chunk's place there."""
    from olmo_core.data import NumpyInterleavedFSLDatasetConfig

    from olmo_data.tokenizer import load_tokenizer

    dataset = NumpyInterleavedFSLDatasetConfig(
        tokenizer=core.tokenizer_config(),
        paths=demo_token_parts[:16],
        sequence_length=L,
        docs_per_instance=2,
        chunks_per_doc=2,
        seed=5,
    )
    config_json, _, reference, _ = drive(core, tmp_path, dataset, monkeypatch, per_batch=4)
    data = open_olmo_core(config_json)
    instance = int(reference[1][-1].index[0])
    loc = data.locate([instance])[0]
    (path, start, end), at = loc.pieces[1], loc.at[1]  # the second document's first chunk
    text = load_tokenizer(demo_tokenizer, "hf").decode(np.fromfile(path, dtype=np.uint16)[start:end].tolist())
    last = reference[0][-1].step
    result = CliRunner().invoke(
        data_main,
        ["trace", config_json, "--spans", text, "--tokenizer", demo_tokenizer, "--steps", f"1..{last}", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    places = [
        p for s in found["spans"] for p in s["places"] if p["path"] == path and p["start"] < end and p["end"] > start
    ]
    want = sorted({s.step for got in reference.values() for s in got if instance in s.index.tolist()})
    assert len(places) == 1 and places[0]["steps"] == want and want
    hits = [h for h in found["trace"]["hits"] if h["instance"] == instance]
    assert {h["step"] for h in hits} == set(want)
    for h in hits:  # where the chunk is in the instance
        assert at <= h["instance_start"] < h["instance_end"] <= at + end - start
