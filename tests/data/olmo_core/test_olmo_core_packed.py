"""OLMo-core's NumpyPackedFSLDataset rebuilt (olmo_data.olmo_core.packed), against OLMo-core 3.0.0 itself.

OLMo-core's real config classes build the run and write its config.json; its real dataset packs the documents
(OBFD) and its NumpyFSLDataLoader, driven as its Trainer drives it, yields the reference batches on 2 ranks over
epochs 1 to 3. Our reading of the config.json alone must give every step's instance numbers, tokens, label
masks and document lengths, from OLMo-core's packing files in the work_dir and, without them, rebuilt (those
files byte for byte). The token files are small and seeded, their documents found by their EOS tokens as
OLMo-core finds them in local files (no .csv.gz), with documents longer than an instance and a tail after the
last EOS. Tests that need OLMo-core skip where it is not installed; the refusals run without it.
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
from olmo_data.olmo_core.packed import CACHE_NAMES, cache_path, pack_lengths
from tests.data.olmo_core.checks import check_written_and_kept, inspected_rows, write_metadata
from tests.olmo_core_commands import chosen_steps

L = 64
SEED = 4321
WORLD = 2
EOS, PAD, VOCAB = 0, 1, 2048


def token_files(
    folder: Path, n_files: int = 5, seed: int = 0, bos: int | None = None, metadata: bool = False
) -> list[str]:
    """Seeded uint16 token files of documents 1..150 tokens long (some past L), each ended by EOS, and a tail
    without one; with `bos`, each document starts with it. With `metadata`, a tokenize-style .csv.gz beside each
    (for the commands' document lookups: OLMo-core finds a local file's documents by its EOS tokens)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(n_files):
        docs = []
        for _ in range(int(rng.integers(20, 40))):
            n = int(rng.choice([rng.integers(1, 20), rng.integers(20, 64), rng.integers(64, 150)], p=[0.4, 0.45, 0.15]))
            body = rng.integers(2, VOCAB, size=n).astype(np.uint16)
            if bos is not None:
                body[0] = bos
            docs.append(np.append(body, np.uint16(EOS)))
        docs.append(rng.integers(2, VOCAB, size=int(rng.integers(1, 10))).astype(np.uint16))  # no EOS: no document
        out.append(str(folder / f"part-{f:02d}.npy"))
        np.concatenate(docs).tofile(out[-1])
        if metadata:
            write_metadata(out[-1], [len(d) for d in docs[:-1]], f"doc-{f}", f"src-{f}.jsonl")
    return out


def packed(core: Any, paths: list[str], tokenizer: Any = None, **kw: Any) -> Any:
    from olmo_core.data import NumpyPackedFSLDatasetConfig

    return NumpyPackedFSLDatasetConfig(
        tokenizer=tokenizer or core.tokenizer_config(), paths=paths, sequence_length=L, **kw
    )


def drive(core: Any, tmp_path: Path, dataset: Any, monkeypatch: pytest.MonkeyPatch, per_batch: int = 8) -> Any:
    """OLMo-core's loader over the run to a step in epoch 3 on WORLD ranks: (config.json, config, reference)."""
    config = core.experiment_config(
        dataset,
        global_batch_size=per_batch * L,
        seed=SEED,
        work_dir=str(tmp_path / "work"),
        save_folder=str(tmp_path / "save"),
    )
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    data = open_olmo_core(config_json, work_dir=str(tmp_path / "not-yet"))  # rebuilt: OLMo-core has not packed yet
    last = 2 * (len(data.dataset) // per_batch) + 2  # two whole epochs, then into the third
    reference = core.drive_loader(config, world_size=WORLD, last_step=last, monkeypatch=monkeypatch)
    assert len(reference[0]) == last and reference[0][-1].epoch == 3
    return config_json, config, reference, data


def compare(data: Any, reference: dict[int, list[Any]], core: Any, *, doc_lens: bool) -> None:
    """Every step, every rank: instance numbers, tokens, label masks, instance masks and doc_lens equal."""
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
                np.testing.assert_array_equal(mine.instance_mask, theirs.instance_mask)
            if doc_lens:
                assert mine.doc_lens is not None and theirs.doc_lens is not None
                assert [d.tolist() for d in mine.doc_lens] == [d.tolist() for d in theirs.doc_lens], (step, rank)
            else:
                assert mine.doc_lens is None and theirs.doc_lens is None


def cache_files(work_dir: Path) -> dict[str, bytes]:
    folder = work_dir / "dataset-common"
    return {f: (folder / f).read_bytes() for f in sorted(os.listdir(folder)) if f.startswith(CACHE_NAMES)}


@pytest.mark.parametrize(
    ("strategy", "group", "perm"), [("truncate", 1, None), ("fragment", 2, 123), ("truncate", 3, 7)]
)
def test_packed_every_step_on_two_ranks(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, group: int, perm: int | None
) -> None:
    """Both long-document strategies, source groups of 1 to 3 files (5 files: a short last group), OLMo-core's
    source_permutation_seed and document lengths; read from OLMo-core's packing files, and rebuilt without
    them (identical, and their bytes identical too)."""
    from olmo_core.data.numpy_dataset import InstanceFilterConfig

    paths = token_files(tmp_path / "tokens", seed=group, metadata=True)
    dataset = packed(
        core,
        paths,
        long_doc_strategy=strategy,
        source_group_size=group,
        source_permutation_seed=perm,
        generate_doc_lengths=True,
        instance_filter_config=InstanceFilterConfig(repetition_max_count=4),
    )
    config_json, config, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    data = open_olmo_core(config_json)
    assert data.run.kind == "packed" and data.run.long_doc_strategy == strategy
    assert all(g.note.startswith("read from") for g in data.dataset.packed.groups)
    assert all(g.note.startswith("rebuilt") for g in rebuilt.dataset.packed.groups)
    assert len(data.dataset.packed.groups) == -(-len(paths) // group)
    compare(data, reference, core, doc_lens=True)
    compare(rebuilt, reference, core, doc_lens=True)
    ids = np.concatenate([s.input_ids for s in reference[0]])
    assert (ids[:, -1] == PAD).any() and (ids[:, 0] != PAD).all()  # padded instances, none empty
    # our packing, written as OLMo-core writes it, is its files byte for byte
    theirs = cache_files(tmp_path / "work")
    assert len(theirs) == 3 * len(data.dataset.packed.groups)
    for g in rebuilt.dataset.packed.groups:
        sizes = tuple(os.path.getsize(p) for p in g.paths)
        arrays = (g.documents.reshape(-1), g.instance_offsets.reshape(-1), g.docs_by_instance)
        for name, array in zip(CACHE_NAMES, arrays, strict=True):
            stored = os.path.basename(cache_path(data.run, name, g.paths, sizes))
            assert array.astype("<u8").tobytes() == theirs[stored], (name, g.paths)
    stats = check_commands(config_json, reference)
    # the tokens instances hold, by OLMo-core's document-indices files: the rest were cut (a truncated document's
    # tail) or follow a file's last EOS
    held = sum(
        int(np.diff(np.frombuffer(b, dtype="<u8").astype(np.int64).reshape(-1, 2)).sum())
        for name, b in theirs.items()
        if name.startswith("document-indices")
    )
    assert sum(f["tokens"] - f["dropped_tokens"] for f in stats["files"]) == held
    check_trace(config_json, reference, data, tmp_path / "work")
    check_build_order(config_json, tmp_path, theirs)


def check_build_order(config_json: str, tmp_path: Path, theirs: dict[str, bytes]) -> None:
    """build-order writes the epochs' orders and the packing files as OLMo-core wrote them (names and bytes);
    in the run's own work_dir, OLMo-core's files are recognised as identical and kept."""
    other = tmp_path / "built"
    check_written_and_kept(config_json, tmp_path / "work", other, theirs, cache_files)
    name = sorted(theirs)[0]
    (other / "dataset-common" / name).write_bytes(theirs[name][:-8] + bytes(8))  # one entry changed
    result = CliRunner().invoke(data_main, ["build-order", config_json, "--destination", str(other)])
    assert result.exit_code != 0 and f"{name}: not the" in result.output and "remove it" in result.output


def test_packed_with_a_bos_token(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a BOS id a document ends at an EOS followed by the BOS (a lone EOS inside a document does not end
    it), and doc_lens follow the same rule; the pad id equal to the EOS makes every pad token a document."""
    from olmo_core.data import TokenizerConfig

    bos = 2
    paths = token_files(tmp_path / "tokens", n_files=3, bos=bos)
    raw = np.fromfile(paths[0], dtype=np.uint16)
    raw[5] = EOS  # an EOS not followed by the BOS: inside a document
    raw.tofile(paths[0])
    tokenizer = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=bos)
    dataset = packed(core, paths, tokenizer, generate_doc_lengths=True, long_doc_strategy="fragment")
    config_json, _, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    compare(open_olmo_core(config_json), reference, core, doc_lens=True)
    compare(rebuilt, reference, core, doc_lens=True)


def test_packed_without_doc_lengths_and_label_masks(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Label mask files come with each document's tokens (False on padding); no doc_lens unless asked."""
    paths = token_files(tmp_path / "tokens", n_files=3, seed=9)
    rng = np.random.default_rng(1)
    masks = []
    for p in paths:
        masks.append(p + ".mask")
        (rng.random(os.path.getsize(p) // 2) < 0.7).tofile(masks[-1])
    dataset = packed(core, paths, label_mask_paths=masks)
    config_json, _, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    compare(open_olmo_core(config_json), reference, core, doc_lens=False)
    compare(rebuilt, reference, core, doc_lens=False)


def unterminated(paths: list[str], every: int = 3) -> None:
    """Drop the EOS of every `every`-th document (the metadata still ends it there), as a producer that cuts
    documents to a length and loses their terminator does: scanning for EOS would merge them with the next."""
    for p in paths:
        tokens = np.fromfile(p, dtype=np.uint16)
        with gzip.open(p[: -len(".npy")] + ".csv.gz", "rt") as meta:
            ends = [int(line.split(",")[1]) for line in meta]
        for end in ends[::every]:
            tokens[end - 1] = 7
        tokens.tofile(p)


def test_packed_documents_from_the_metadata(core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """use_array_if_local: false takes documents from each file's .csv.gz, where some lack their EOS: OLMo-core's
    packing (its files keyed by the metadata's sha256) and its doc_lens from the documents themselves."""
    paths = token_files(tmp_path / "tokens", n_files=4, seed=5, metadata=True)
    unterminated(paths)
    dataset = packed(
        core,
        paths,
        use_array_if_local=False,
        generate_doc_lengths=True,
        source_group_size=2,
        long_doc_strategy="fragment",
    )
    config_json, _, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
    data = open_olmo_core(config_json)
    assert all(g.note.startswith("read from") and g.from_metadata for g in data.dataset.packed.groups)
    compare(data, reference, core, doc_lens=True)
    compare(rebuilt, reference, core, doc_lens=True)
    lens = [d for s in reference[0] for d in s.doc_lens]
    merged = [len(row[:-1][row[:-1] == EOS]) for s in reference[0] for row in s.input_ids]
    assert sum(len(d) for d in lens) > sum(merged)  # documents without their EOS are documents still


def test_packed_over_http_reads_documents_from_the_metadata(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remote token files: OLMo-core (and we) take the documents from the .csv.gz beside each, over HTTP."""
    from tests.flaky_server import FlakyServer

    root = tmp_path / "www"
    paths = token_files(root, n_files=3, seed=6, metadata=True)
    server = FlakyServer(root)
    server._server.RequestHandlerClass.protocol_version = "HTTP/1.0"  # type: ignore[attr-defined]
    with server:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        dataset = packed(core, urls, generate_doc_lengths=True)
        config_json, _, reference, rebuilt = drive(core, tmp_path, dataset, monkeypatch)
        compare(open_olmo_core(config_json), reference, core, doc_lens=True)
        compare(rebuilt, reference, core, doc_lens=True)


def check_commands(config_json: str, reference: dict[int, list[Any]]) -> dict[str, Any]:
    """inspect-batch --json at the first steps of epochs 1 and 2 and the last step, each rank: ids and tokens
    equal OLMo-core's, each instance's pieces are its tokens in the files; stats counts OLMo-core's instances."""
    runner = CliRunner()
    steps = reference[0]
    for theirs, row, inst in inspected_rows(config_json, reference, chosen_steps(reference)):
        read = [np.fromfile(p, dtype=np.uint16)[s:e] for p, s, e in inst["pieces"]]
        used = sum(len(r) for r in read)
        np.testing.assert_array_equal(np.concatenate(read), theirs.input_ids[row][:used])
        assert inst["doc_lens"] == theirs.doc_lens[row].tolist()
        if inst["documents"] is not None:  # the metadata's documents of each piece, where it sits
            spans = [(d["instance_start"], d["instance_end"]) for d in inst["documents"]]
            assert spans[0][0] == 0 and spans[-1][1] == used
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    result = runner.invoke(data_main, ["stats", config_json, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["trainer"] == "olmo-core" and stats["num_instances"] == len(open_olmo_core(config_json).dataset)
    assert stats["batches_per_epoch"] == sum(1 for s in steps if s.epoch == 1)
    assert sum(f["instances"] for f in stats["files"]) == stats["num_instances"]
    assert all(f["dropped_tokens"] > 0 for f in stats["files"])  # every file has a tail after its last EOS
    return stats


def check_trace(config_json: str, reference: dict[int, list[Any]], data: Any, work_dir: Path) -> None:
    """trace --document names exactly the (step, rank) pairs whose OLMo-core batches held one of its tokens, by
    OLMo-core's own packing files (which instance holds which token span of the group's files)."""
    last = reference[0][-1]
    instance = int(last.index[0])
    g = int(np.searchsorted(data.dataset.packed.group_offsets, instance, side="right")) - 1
    group = data.dataset.packed.groups[g]
    sizes = tuple(os.path.getsize(p) for p in group.paths)
    docs, offsets, flat = (
        np.fromfile(cache_path(data.run, name, group.paths, sizes), dtype="<u8").astype(np.int64)
        for name in CACHE_NAMES
    )
    docs, offsets = docs.reshape(-1, 2), offsets.reshape(-1, 2)
    local = instance - int(data.dataset.packed.group_offsets[g])
    a, b = docs[flat[offsets[local, 0]]]  # its first document, in the group's tokens
    k = int(np.searchsorted(np.cumsum([0, *group.sizes]), a, side="right")) - 1
    base = sum(group.sizes[:k])
    with gzip.open(group.paths[k][: -len(".npy")] + ".csv.gz", "rt") as meta:
        rows = [line.split(",") for line in meta]
    doc_id, d_start, d_end = next((r[2], int(r[0]), int(r[1])) for r in rows if int(r[0]) <= a - base < int(r[1]))
    holding = set()
    for j in range(len(offsets)):
        for d in flat[offsets[j, 0] : offsets[j, 1]]:
            lo, hi = docs[d] - base
            if lo < d_end and hi > d_start and 0 <= lo and hi <= group.sizes[k]:
                holding.add(int(data.dataset.packed.group_offsets[g]) + j)
    want = sorted({(s.step, r) for r, steps in reference.items() for s in steps if holding & set(s.index.tolist())})
    result = CliRunner().invoke(
        data_main,
        ["trace", config_json, "--document", doc_id, "--steps", f"1..{last.step}", "--world-size", "2", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert sorted({(h["step"], h["rank"]) for h in hits}) == want and want
    assert {h["instance"] for h in hits} == holding
    for h in hits:  # each hit's span of the instance is the document's tokens there
        row = data.batch(h["step"]).tokens[h["position"]]
        piece = np.fromfile(group.paths[k], dtype=np.uint16)[d_start:d_end]
        span = row[h["instance_start"] : h["instance_end"]]
        assert len(span) and any(
            np.array_equal(span, piece[i : i + len(span)]) for i in range(len(piece) - len(span) + 1)
        )


def test_pack_lengths_is_best_fit_decreasing() -> None:
    """The least room that holds a document wins, the first opened among equals; no room: a new instance."""
    assert pack_lengths(np.array([5, 4, 3, 3, 2, 1, 1]), 8) == [[0, 2], [1, 3, 5], [4, 6]]
    assert pack_lengths(np.array([8, 8]), 8) == [[0], [1]]


def minimal(tmp_path: Path, **dataset: Any) -> dict[str, Any]:
    path = token_files(tmp_path / "tokens", n_files=1)[0]
    return {
        "dataset": {
            "_CLASS_": "olmo_core.data.numpy_dataset.NumpyPackedFSLDatasetConfig",
            "paths": [path],
            "sequence_length": L,
            "tokenizer": {"vocab_size": VOCAB, "eos_token_id": EOS, "pad_token_id": PAD},
            **dataset,
        },
        "data_loader": {
            "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
            "global_batch_size": 12 * L,  # a multiple of 48 too (the power-of-two refusal)
            "seed": 1,
            "work_dir": str(tmp_path / "work"),
        },
    }


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"long_doc_strategy": "split"},
            "dataset.long_doc_strategy is 'split'; expected one of ['truncate', 'fragment']",
        ),
        ({"sequence_length": 48}, "dataset.sequence_length is 48; OLMo-core's packer needs a power of two"),
        ({"use_array_if_local": "no"}, "dataset.use_array_if_local is 'no'; expected true or false"),
        ({"source_group_size": 0}, "dataset.source_group_size is 0; expected a whole number from 1"),
        ({"generate_doc_lengths": "yes"}, "dataset.generate_doc_lengths is 'yes'; expected true or false"),
    ],
)
def test_packed_refusals_name_the_key(tmp_path: Path, keys: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError) as e:
        read_olmo_core_config(minimal(tmp_path, **keys))
    assert message in str(e.value)


def test_damaged_packing_files_are_refused(tmp_path: Path) -> None:
    """A packing file that does not fit the token files is named, with what to do, before any batch is read."""
    config = minimal(tmp_path)
    data = open_olmo_core(config)
    group = data.dataset.packed.groups[0]
    sizes = tuple(os.path.getsize(p) for p in group.paths)
    arrays = (group.documents.reshape(-1), group.instance_offsets.reshape(-1), group.docs_by_instance)
    for name, array in zip(CACHE_NAMES, arrays, strict=True):
        target = Path(cache_path(data.run, name, group.paths, sizes))
        target.parent.mkdir(parents=True, exist_ok=True)
        array.astype("<u8").tofile(target)
    again = open_olmo_core(config)
    assert again.dataset.packed.groups[0].note.startswith("read from")
    assert again.batch(1).fingerprint == data.batch(1).fingerprint
    target = Path(cache_path(data.run, "documents-by-instance", group.paths, sizes))
    bad = group.docs_by_instance.copy()
    bad[0] = 10**6
    bad.astype("<u8").tofile(target)
    with pytest.raises(DataError, match="do not fit these token files .* remove the three"):
        open_olmo_core(config)


def test_pack_lengths_equals_olmo_core_at_olmo3_length(core: Any) -> None:
    """At OLMo 3's long-context length (65,536) on 20,000 documents of spread lengths, the same instances as
    OLMo-core's InstancePacker (its segment tree), document for document."""
    from olmo_core.data.utils import InstancePacker

    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(7, 1.5, size=20_000).astype(np.int64) + 1, 65_536)
    spans = np.stack([np.zeros_like(lengths), lengths], axis=1).astype(np.uint64)
    theirs, _, _ = InstancePacker(65_536).pack_documents(spans)
    order = np.argsort(-1 * lengths)
    assert pack_lengths(lengths[order], 65_536) == theirs


def test_metadata_faults_are_one_line_naming_the_file(tmp_path: Path) -> None:
    """With documents from metadata: a missing .csv.gz, and a row outside its token file, each named."""
    config = minimal(tmp_path, use_array_if_local=False)
    path = config["dataset"]["paths"][0]
    meta = path[: -len(".npy")] + ".csv.gz"
    with pytest.raises(DataError, match=f"{meta}: OLMo-core packs {path}'s documents from this metadata file"):
        open_olmo_core(config)
    n = os.path.getsize(path) // 2
    with gzip.open(meta, "wt") as f:
        f.write(f"0,10,a,s,1\n10,{n + 5},b,s,2\n")
    with pytest.raises(DataError, match=rf"{meta}: row 2 is tokens \[10, {n + 5:,}\), outside its token file"):
        open_olmo_core(config)
    with gzip.open(meta, "wt") as f:
        f.write("0,10,a,s,1\n10,10,b,s,2\n")
    with pytest.raises(DataError, match=rf"{meta}: row 2 is an empty document .* remove the row"):
        open_olmo_core(config)
