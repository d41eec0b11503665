"""inspect-batch: every instance's tokens and documents, checked against the documents' own text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.dataset.instances import open_from_config
from olmo_data.dataset.order import build_config_orders
from olmo_data.errors import DataError
from olmo_data.remote import RemoteReader
from olmo_data.run.batches import format_report, inspect_batch
from olmo_data.tokenizer import load_tokenizer

SEQ, GBS, SEED = 128, 12, 77


@pytest.fixture(scope="module")
def tokens_dir(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    from olmo_data.tokenize import TokenizeOptions, tokenize

    dest = tmp_path_factory.mktemp("tokens") / "demo"
    tokenize(demo_corpus, dest, TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=60_000))
    return str(dest)


@pytest.fixture(scope="module")
def documents(demo_corpus: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """Every document of the corpus by (file, 1-based line), read independently of the library."""
    out = {}
    for path in demo_corpus:
        with gzip.open(path, "rt") as f:
            for line_no, line in enumerate(f, start=1):
                out[(path, line_no)] = json.loads(line)
    return out


def write_config(tmp_path: Path, tokens_dir: str, **data: Any) -> str:
    cfg = {
        "seed": SEED,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": GBS,
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": [tokens_dir], **data},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def reference_instances(tokens_dir: str) -> np.ndarray:
    manifest = json.loads((Path(tokens_dir) / "manifest.json").read_text())
    chunks = []
    for f in manifest["files"]:
        arr = np.fromfile(Path(tokens_dir) / f["path"], dtype=manifest["dtype"])
        chunks.append(arr[: len(arr) // SEQ * SEQ].reshape(-1, SEQ))
    return np.concatenate(chunks).astype(np.int64)


def test_provenance_of_sampled_batches_matches_document_text(
    tmp_path: Path, tokens_dir: str, demo_tokenizer: str, documents: dict[tuple[str, int], dict[str, Any]]
) -> None:
    config = write_config(tmp_path, tokens_dir)
    cfg = yaml.safe_load(Path(config).read_text())
    build_config_orders(cfg, epochs=2)
    ref = reference_instances(tokens_dir)
    n = len(ref)
    per_epoch = n // GBS
    tok = load_tokenizer(demo_tokenizer, "hf")
    eos = json.loads((Path(tokens_dir) / "manifest.json").read_text())["eos_token_id"]
    encoded: dict[tuple[str, int], list[int]] = {}
    index = DocIndex(str(tmp_path / "cache"))
    for step in (1, 2, per_epoch // 2, per_epoch, per_epoch + 1, 2 * per_epoch):
        report = inspect_batch(config, step=step, doc_index=index)
        epoch, b = (step - 1) // per_epoch, (step - 1) % per_epoch
        perm = np.arange(n)
        np.random.Generator(np.random.PCG64(SEED + epoch)).shuffle(perm)
        expect = perm[b * GBS : (b + 1) * GBS]
        assert [i.instance for i in report.instances] == expect.tolist()
        assert (report.epoch, report.batch_in_epoch) == (epoch, b)
        assert report.batch_fingerprint == batch_fingerprint(ref[expect])
        for inst in report.instances:
            assert inst.token_ids.tolist() == ref[inst.instance].tolist()
            assert inst.documents
            covered = 0
            for d in inst.documents:
                assert d.instance_start == covered  # documents tile the instance in order
                covered = d.instance_end
                doc = documents[(d.src, d.loc)]
                assert doc["id"] == d.id
                if (d.src, d.loc) not in encoded:
                    # tokenize strips surrounding whitespace (as `dolma tokens` does) and appends EOS
                    encoded[(d.src, d.loc)] = tok.encode(doc["text"].strip()) + [eos]
                full = encoded[(d.src, d.loc)]
                assert len(full) == d.end - d.start
                span = d.instance_end - d.instance_start
                got = inst.token_ids[d.instance_start : d.instance_end].tolist()
                assert got == full[d.document_start : d.document_start + span]
            assert covered == SEQ
    assert index.built > 0
    again = DocIndex(str(tmp_path / "cache"))
    inspect_batch(config, step=1, doc_index=again)
    assert again.built == 0  # the side indexes were built once and reused


def test_rank_parts_and_decode(tmp_path: Path, tokens_dir: str, demo_tokenizer: str) -> None:
    config = write_config(tmp_path, tokens_dir)
    build_config_orders(yaml.safe_load(Path(config).read_text()))
    cache = DocIndex(str(tmp_path / "cache"))
    full = inspect_batch(config, batch_index=3, doc_index=cache)
    assert full.step == 4
    for world in (1, 2, 3, 4, 6, 12):
        parts = [inspect_batch(config, batch_index=3, rank=r, world_size=world, doc_index=cache) for r in range(world)]
        positions = sorted(i.position for p in parts for i in p.instances)
        assert positions == list(range(GBS))
        for r, p in enumerate(parts):
            assert [i.position for i in p.instances] == list(range(r, GBS, world))
            assert p.batch_fingerprint == full.batch_fingerprint  # always the whole global batch's
            for i in p.instances:
                assert i.instance == full.instances[i.position].instance
    decoded = inspect_batch(
        config, step=4, rank=1, world_size=4, decode=True, tokenizer=demo_tokenizer, doc_index=cache
    )
    tok = load_tokenizer(demo_tokenizer, "hf")
    for i in decoded.instances:
        assert i.text == tok.decode(i.token_ids.tolist()) and i.text
    assert "batch fingerprint: " + full.batch_fingerprint in format_report(decoded)


def test_cli_json_and_text(tmp_path: Path, tokens_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    config = write_config(tmp_path, tokens_dir)
    runner = CliRunner()
    built = runner.invoke(main, ["build-order", config, "--epochs", "2"])
    assert built.exit_code == 0, built.output
    assert "global_indices.npy: epoch 0" in built.output and "global_indices_epoch1.npy: epoch 1" in built.output
    res = runner.invoke(main, ["inspect-batch", config, "--step", "5", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    api = inspect_batch(config, step=5, doc_index=DocIndex(str(tmp_path / "cache")))
    assert doc["batch_fingerprint"] == api.batch_fingerprint
    assert [i["instance"] for i in doc["instances"]] == [i.instance for i in api.instances]
    assert [i["token_ids"] for i in doc["instances"]] == [i.token_ids.tolist() for i in api.instances]
    assert all(len(i["token_ids"]) == SEQ and i["label_mask"] is None for i in doc["instances"])
    first_docs = api.instances[0].documents
    assert first_docs and doc["instances"][0]["documents"][0]["id"] == first_docs[0].id
    text = runner.invoke(main, ["inspect-batch", config, "--batch-index", "4", "--rank", "1", "--world-size", "3"])
    assert text.exit_code == 0, text.output
    assert f"batch fingerprint: {api.batch_fingerprint}" in text.output
    assert "rank 1 of world size 3" in text.output and "[1] instance" in text.output and "[4] instance" in text.output


def test_bad_input_messages(tmp_path: Path, tokens_dir: str) -> None:
    config = write_config(tmp_path, tokens_dir)
    cfg = yaml.safe_load(Path(config).read_text())
    cache = DocIndex(str(tmp_path / "cache"))
    # missing order file
    with pytest.raises(DataError, match=r"global_indices.npy: order file not found"):
        inspect_batch(config, step=1, doc_index=cache)
    build_config_orders(cfg)
    per_epoch = len(open_from_config(cfg)) // GBS
    # a step past the end of the order (only epoch 0 was built)
    with pytest.raises(
        DataError,
        match=rf"step {per_epoch + 1} is past the end of the orders built: it is batch 0 "
        r"of epoch 1 .*global_indices_epoch1.npy: order file not found",
    ):
        inspect_batch(config, step=per_epoch + 1, doc_index=cache)
    short = tmp_path / "short.npy"
    np.fromfile(tmp_path / "run" / "train_data" / "global_indices.npy", dtype="<u4")[: 2 * GBS].tofile(short)
    with pytest.raises(
        DataError,
        match=r"step 3 \(batch index 2\) is past the end of the order: .*short.npy: the "
        r"order holds 24 instances",
    ):
        inspect_batch(config, step=3, order=str(short), doc_index=cache)
    # a dtype that disagrees with the manifest
    (tmp_path / "d").mkdir()
    bad_dtype = write_config(tmp_path / "d", tokens_dir, dtype="uint32")
    with pytest.raises(DataError, match=r"dtype uint32 was requested but the directory's manifest says uint16"):
        inspect_batch(bad_dtype, step=1, doc_index=cache)
    # data paths changed since the order was built (same save_folder, one file fewer)
    manifest = json.loads((Path(tokens_dir) / "manifest.json").read_text())
    fewer = [str(Path(tokens_dir) / f["path"]) for f in manifest["files"][:-1]]
    cfg_changed = dict(cfg, data={"paths": fewer})
    with pytest.raises(
        DataError,
        match=r"this order was built for other data .*the data paths changed since the "
        r"order was built",
    ):
        inspect_batch(cfg_changed, step=1, doc_index=cache)
    # the same files at another path: refused, unless the user says so; the batch fingerprint then confirms
    import shutil

    shutil.copytree(tokens_dir, tmp_path / "moved")
    cfg_moved = dict(cfg, data={"paths": [str(tmp_path / "moved")]})
    with pytest.raises(DataError, match=r"if the same files only moved, inspect-batch --no-verify-data"):
        inspect_batch(cfg_moved, step=1, doc_index=cache)
    moved = inspect_batch(cfg_moved, step=1, doc_index=cache, verify_data=False)
    original = inspect_batch(config, step=1, doc_index=cache)
    assert moved.data_fingerprint != original.data_fingerprint
    assert moved.batch_fingerprint == original.batch_fingerprint
    # an order built with another seed (the same data) is not this run's order
    with pytest.raises(
        DataError,
        match=rf"global_indices.npy: this order was built with seed {SEED}, but the config's seed is "
        rf"{SEED + 1}; it is not this run's order: set seed: {SEED} in the config",
    ):
        inspect_batch(dict(cfg, seed=SEED + 1), step=1, doc_index=cache)
    # epoch 0's order (and side file) copied in as epoch 1's
    for suffix in ("npy", "json"):
        shutil.copy(tmp_path / "run" / "train_data" / f"global_indices.{suffix}", tmp_path / f"e_epoch1.{suffix}")
    with pytest.raises(DataError, match=r"e_epoch1.npy: this order was built for epoch 0, but it is read as"):
        inspect_batch(config, step=per_epoch + 1, order=str(tmp_path / "e.npy"), doc_index=cache)
    with pytest.raises(DataError, match=r"--rank and --world-size go together"):
        inspect_batch(config, step=1, rank=1, doc_index=cache)
    with pytest.raises(DataError, match=r"exactly one of --step .* and --batch-index"):
        inspect_batch(config, doc_index=cache)
    with pytest.raises(DataError, match=r"world size 5 does not divide the global batch size 12"):
        inspect_batch(config, step=1, rank=0, world_size=5, doc_index=cache)
    with pytest.raises(DataError, match=r"nope.yaml: config file not found"):
        inspect_batch(str(tmp_path / "nope.yaml"), step=1)
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(cfg_changed))
    res = CliRunner().invoke(main, ["build-order", str(changed_path)])
    assert res.exit_code == 2 and "this order was built for other data" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["inspect-batch", config, "--step", "0"])
    assert res.exit_code == 2 and "training steps count from 1" in res.output and "Traceback" not in res.output


def _retokenizer(tmp_path: Path, tokens_dir: str, **identity: Any) -> str:
    """A copy of the token directory whose manifest's tokenizer identity is changed; its config, orders built."""
    import shutil

    copy = tmp_path / "tokens"
    shutil.copytree(tokens_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["tokenizer"] = {k: v for k, v in {**manifest["tokenizer"], **identity}.items() if v is not None}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    config = write_config(tmp_path, str(copy))
    build_config_orders(yaml.safe_load(Path(config).read_text()))
    return config


def _altered(tokenizer: str, where: Path) -> str:
    """The same tokenizer with the ids of two tokens swapped: loads fine, decodes differently, another sha256."""
    data = json.loads(Path(tokenizer).read_text())
    vocab = data["model"]["vocab"]
    a, b = (next(t for t, i in vocab.items() if i == k) for k in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    where.write_text(json.dumps(data))
    return str(where)


def test_decode_uses_the_recorded_tokenizer_and_checks_its_sha(
    tmp_path: Path, tokens_dir: str, demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = json.loads((Path(tokens_dir) / "manifest.json").read_text())["tokenizer"]
    assert recorded["path"] == str(Path(demo_tokenizer).resolve())
    tok = load_tokenizer(demo_tokenizer, "hf")
    config = write_config(tmp_path, tokens_dir)
    build_config_orders(yaml.safe_load(Path(config).read_text()))
    monkeypatch.chdir(tmp_path)  # the recorded path is absolute: found from anywhere
    report = inspect_batch(config, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))
    assert all(i.text == tok.decode(i.token_ids.tolist()) and i.text for i in report.instances)

    # the recorded path now holds another tokenizer
    other = _altered(demo_tokenizer, tmp_path / "other.json")
    changed = _retokenizer(tmp_path / "a", tokens_dir, path=other)
    with pytest.raises(
        DataError,
        match=rf"--decode: the tokenizer at .*other.json has sha256 [0-9a-f]{{64}}, but .*manifest.json records "
        rf"sha256 {recorded['sha256']} for {recorded['name']!r}: it is not the tokenizer .*pass --tokenizer PATH",
    ):
        inspect_batch(changed, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))
    # an explicit --tokenizer that is not the data's is refused too
    with pytest.raises(
        DataError,
        match=rf"--tokenizer .*other.json has sha256 [0-9a-f]{{64}}, but .*manifest.json records that the data "
        rf"was tokenized with {recorded['name']!r} \(sha256 {recorded['sha256']}\)",
    ):
        inspect_batch(config, step=1, decode=True, tokenizer=other, doc_index=DocIndex(str(tmp_path / "c")))
    res = CliRunner().invoke(main, ["inspect-batch", config, "--step", "1", "--decode", "--tokenizer", other])
    assert res.exit_code == 2 and "has sha256" in res.output and "Traceback" not in res.output


def test_decode_falls_back_to_the_name_only_when_its_sha_matches(
    tmp_path: Path, tokens_dir: str, demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    recorded = json.loads((Path(tokens_dir) / "manifest.json").read_text())["tokenizer"]
    config = _retokenizer(tmp_path, tokens_dir, path=None)  # a manifest written before `path` was recorded
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(
        DataError, match=rf"--decode needs the tokenizer: .*manifest.json names {recorded['name']!r} but records no"
    ):
        inspect_batch(config, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))
    _altered(demo_tokenizer, here / recorded["name"])  # a file of that name, but not that tokenizer
    with pytest.raises(DataError, match=r"--decode: the tokenizer at .* has sha256 .* it is not the tokenizer"):
        inspect_batch(config, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))
    shutil.copy(demo_tokenizer, here / recorded["name"])  # the real one
    report = inspect_batch(config, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))
    assert all(i.text for i in report.instances)


def test_decode_without_a_loadable_tokenizer(tmp_path: Path, tokens_dir: str) -> None:
    config = _retokenizer(tmp_path, tokens_dir, path=str(tmp_path / "gone" / "tokenizer.json"))
    with pytest.raises(
        DataError,
        match=r"--decode needs the tokenizer: .*manifest.json records .*gone/tokenizer.json.*, which cannot "
        r"be loaded here .*pass --tokenizer PATH",
    ):
        inspect_batch(config, step=1, decode=True, doc_index=DocIndex(str(tmp_path / "c")))


def test_token_files_without_metadata(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "plain.npy")
    cfg = {
        "seed": 1,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": 2,
        "model": {"max_sequence_length": 10},
        "data": {"paths": [str(tmp_path / "plain.npy")]},
    }
    build_config_orders(cfg)
    report = inspect_batch(cfg, step=1, doc_index=DocIndex(str(tmp_path / "c")))
    assert all(i.documents is None for i in report.instances)
    assert "no metadata beside the token file" in format_report(report)


def test_sparse_100b_token_dataset(tmp_path: Path) -> None:
    """Offsets past 2**32 tokens, on sparse files (no real disk use): locations and documents stay exact."""
    seq = 1 << 20
    sizes = [60_000_000_000, 40_000_000_000]  # 100B uint32 tokens = 400 GB apparent size, ~0 bytes on disk
    paths = []
    for k, size in enumerate(sizes):
        p = tmp_path / f"part-{k:05d}-00000.npy"
        with open(p, "wb") as f:
            f.truncate(size * 4)
        docs = np.linspace(0, size, 1001, dtype=np.int64)  # 1000 documents per file
        with gzip.open(tmp_path / f"part-{k:05d}-00000.csv.gz", "wt") as g:
            for i in range(1000):
                g.write(f"{docs[i]},{docs[i + 1]},doc-{k}-{i},src{k}.jsonl,{i + 1}\n")
        paths.append(str(p))
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "format": "olmo-data.tokens",
                "version": 1,
                "dtype": "uint32",
                "files": [
                    {"path": Path(p).name, "metadata": Path(p).name.replace(".npy", ".csv.gz"), "tokens": s}
                    for p, s in zip(paths, sizes, strict=True)
                ],
            }
        )
    )
    cfg = {
        "seed": 3,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": 4,
        "model": {"max_sequence_length": seq},
        "data": {"paths": [str(tmp_path)]},
    }
    per_file = [s // seq for s in sizes]
    n = sum(per_file)
    perm = np.arange(n)
    np.random.Generator(np.random.PCG64(3)).shuffle(perm)
    # mark the instances of one batch with their own index, written into the sparse files
    step = 1000
    batch = perm[(step - 1) * 4 : step * 4]
    for inst in batch.tolist():
        k = 0 if inst < per_file[0] else 1
        offset = (inst - (0 if k == 0 else per_file[0])) * seq
        m = np.memmap(paths[k], dtype="<u4", mode="r+")
        m[offset : offset + 3] = [inst, inst + 1, inst + 2]
        m.flush()
        del m
    build_config_orders(cfg)
    report = inspect_batch(cfg, step=step, doc_index=DocIndex(str(tmp_path / "cache")))
    assert [i.instance for i in report.instances] == batch.tolist()
    for inst in report.instances:
        k = 0 if inst.instance < per_file[0] else 1
        offset = (inst.instance - (0 if k == 0 else per_file[0])) * seq
        assert (Path(inst.path).name, inst.token_offset) == (Path(paths[k]).name, offset)
        assert inst.token_ids[:4].tolist() == [inst.instance, inst.instance + 1, inst.instance + 2, 0]
        docs = np.linspace(0, sizes[k], 1001, dtype=np.int64)
        i = int(np.searchsorted(docs, offset, side="right")) - 1
        assert inst.documents and inst.documents[0].id == f"doc-{k}-{i}"
        assert inst.documents[0].document_start == offset - docs[i]
    assert sum(p.stat().st_blocks for p in tmp_path.glob("part-*.npy")) * 512 < 100 * 2**20  # still sparse


def test_inspect_over_http_matches_local(tmp_path: Path, tokens_dir: str, fresh_reader: RemoteReader) -> None:
    """Token files, metadata and the order served over HTTP (ranged reads) give the batch local disk gives."""
    import shutil

    from tests.flaky_server import FlakyServer

    www = tmp_path / "www"
    shutil.copytree(tokens_dir, www / "demo")
    with FlakyServer(www) as server:
        url = server.url
        local = yaml.safe_load(Path(write_config(tmp_path, tokens_dir)).read_text())
        remote = dict(local, data={"paths": [f"{url}/demo/"]})
        build_config_orders(local)
        build_config_orders(remote, location=str(www / "order"))
        a = inspect_batch(local, step=7, doc_index=DocIndex(str(tmp_path / "c1")))
        b = inspect_batch(remote, step=7, order=f"{url}/order", doc_index=DocIndex(str(tmp_path / "c2")))
        assert b.order_path == f"{url}/order/global_indices.npy"
        assert a.batch_fingerprint == b.batch_fingerprint
        for x, y in zip(a.instances, b.instances, strict=True):
            assert (x.instance, x.token_offset) == (y.instance, y.token_offset)
            np.testing.assert_array_equal(x.token_ids, y.token_ids)
            assert y.path.startswith(url) and Path(x.path).name == y.path.rsplit("/", 1)[1]
            assert [d.id for d in x.documents or []] == [d.id for d in y.documents or []]
        # instances of a small demo file lie close together: merged requests, fewer than one per instance
        token_requests = sum(
            n for path, n in server.ranges_by_file.items() if path.startswith("/demo/") and path.endswith(".npy")
        )
        assert len({y.path for y in b.instances}) <= token_requests < GBS


def test_config_errors(tmp_path: Path) -> None:
    """The data commands read a config as the trainer does (olmo_data.config): its refusals, naming file and key."""
    from olmo_data.config import read_run_config

    bad = tmp_path / "bad.yaml"
    for text, message in (
        ("global_train_batch_size: many", r"bad.yaml: config key 'global_train_batch_size': got 'many'"),
        ("model: [1, 2]", r"bad.yaml: model: expected a mapping of keys"),
        ("data: {paths: [x", r"bad.yaml: not valid YAML"),
        ("data: {paths: 5}", r"bad.yaml: config key 'data.paths': got 5, expected a list"),
        ("data: {paths: [a], label_mask_paths: 3}", r"bad.yaml: config key 'data.label_mask_paths': got 3"),
        ("data: {mix: [a]}", r"bad.yaml: config key 'data.mix': got \['a'\]"),
        ("data: {paths: [a], dtype: int8}", r"bad.yaml: config key 'data.dtype': got 'int8', expected one of"),
        ("data: {paths: [a]}\nmodel: {max_sequence_length: 0}", r"bad.yaml: config key 'model.max_sequence_length'"),
        ("save_folder: runs/x", r"bad.yaml: config: no training data; set data.paths"),
    ):
        bad.write_text(text + "\n")
        with pytest.raises(DataError, match=message):
            read_run_config(str(bad))
    # the commands that read a config print the message, not a traceback
    bad.write_text("data: {paths: 5}\n")
    for command in (
        ["build-order", str(bad)],
        ["stats", "--config", str(bad)],
        ["inspect-batch", str(bad), "--step", "1"],
    ):
        res = CliRunner().invoke(main, command)
        assert res.exit_code == 2 and "config key 'data.paths': got 5" in res.output, (command, res.output)
        assert "Traceback" not in res.output
    bad.write_text("model:\ndata:\n")  # empty sections take the trainer's defaults
    cfg = read_run_config(str(bad), require_data=False)
    assert cfg.model.max_sequence_length == 1024 and cfg.data.paths == [] and cfg.seed == 6198


def test_load_remote_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An order URL (OLMo publishes theirs) is fetched once into the cache and memory-mapped."""
    import http.server
    import threading

    from olmo_data.dataset.instances import open_dataset
    from olmo_data.dataset.order import build_order, load_order, write_order

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    www = tmp_path / "www"
    www.mkdir()
    np.arange(4000, dtype=np.uint16).tofile(tmp_path / "tokens.npy")
    ds = open_dataset([str(tmp_path / "tokens.npy")], sequence_length=4)
    write_order(str(www / "global_indices.npy"), build_order(1000, 4, 0), seed=4, epoch=0, source=ds)

    def make(*args: Any, **kw: Any) -> http.server.SimpleHTTPRequestHandler:
        return http.server.SimpleHTTPRequestHandler(*args, directory=str(www), **kw)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/global_indices.npy"
        np.testing.assert_array_equal(load_order(url, ds.fingerprint()), build_order(1000, 4, 0))
        assert len(list((tmp_path / "cache" / "downloads").iterdir())) == 1  # kept in the cache
        with pytest.raises(DataError, match=r"this order was built for other data"):
            load_order(url, expected_fingerprint="0000")
        # rebuilt in place with another seed (the same size): its side file says so, and the new one is fetched
        write_order(str(www / "global_indices.npy"), build_order(1000, 5, 0), seed=5, epoch=0, source=ds)
        np.testing.assert_array_equal(load_order(url, ds.fingerprint(), seed=5), build_order(1000, 5, 0))
    finally:
        server.shutdown()
        server.server_close()


def test_a_stalled_order_url_fails_within_the_timeout_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Orders used to come through cached-path, which has no timeout: a stalled server hung the run forever."""
    import time

    from olmo_data.dataset.instances import open_dataset
    from olmo_data.dataset.order import build_order, load_order, write_order
    from tests.flaky_server import Faults, FlakyServer

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLMO_DATA_REMOTE_TIMEOUT_S", "0.3")
    monkeypatch.setenv("OLMO_DATA_REMOTE_ATTEMPTS", "2")
    monkeypatch.setattr("olmo_data.remote.reader._READER", None)  # the next reader reads the settings above
    np.arange(4000, dtype=np.uint16).tofile(tmp_path / "tokens.npy")
    ds = open_dataset([str(tmp_path / "tokens.npy")], sequence_length=4)
    (tmp_path / "www").mkdir()
    write_order(str(tmp_path / "www" / "global_indices.npy"), build_order(1000, 4, 0), seed=4, epoch=0, source=ds)
    with FlakyServer(tmp_path / "www", Faults(stall="global_indices.npy")) as server:
        url = f"{server.url}/global_indices.npy"
        began = time.monotonic()
        with pytest.raises(DataError, match=rf"cannot fetch the order file: {url}: .*no answer for 0.3 s"):
            load_order(url, ds.fingerprint())
        assert time.monotonic() - began < 5
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # nothing partial kept


def test_a_step_past_max_duration_is_flagged(tmp_path: Path, tokens_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    config = write_config(tmp_path, tokens_dir)
    cfg = yaml.safe_load(Path(config).read_text())
    Path(config).write_text(yaml.safe_dump({**cfg, "max_duration": 4}))
    runner = CliRunner()
    assert runner.invoke(main, ["build-order", config]).exit_code == 0
    inside = runner.invoke(main, ["inspect-batch", config, "--step", "4"])
    past = runner.invoke(main, ["inspect-batch", config, "--step", "5"])
    assert inside.exit_code == past.exit_code == 0, past.output
    assert "never trained" not in inside.output
    assert "note: the run trains 4 steps (its max_duration), so it never trained step 5" in past.output
    assert inspect_batch(config, step=5).run_steps == 4


def test_metadata_row_past_its_token_file_is_refused(tmp_path: Path, tokens_dir: str) -> None:
    """A `.csv.gz` row ending past its token file would attribute every later instance to one document."""
    import shutil

    from olmo_data.trace.find import find_documents

    data = tmp_path / "tokens"
    shutil.copytree(tokens_dir, data)
    manifest = json.loads((data / "manifest.json").read_text())
    first = manifest["files"][0]
    tokens = len(np.fromfile(data / first["path"], dtype=manifest["dtype"]))
    csv_path = data / first["path"].replace(".npy", ".csv.gz")
    rows = gzip.open(csv_path, "rt").read().splitlines()
    start, _end, *rest = rows[-1].split(",")
    rows[-1] = ",".join([start, str(tokens + 1000), *rest])
    with gzip.open(csv_path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    config = write_config(tmp_path, str(data / first["path"]))  # its metadata is found beside it
    cfg = yaml.safe_load(Path(config).read_text())
    build_config_orders(cfg)
    expected = rf"{csv_path.name}: row {len(rows)} ends at token {tokens + 1000}, past the end of its token file"
    with pytest.raises(DataError, match=expected):
        inspect_batch(config, step=1, doc_index=DocIndex(str(tmp_path / "cache")))
    with pytest.raises(DataError, match=expected):
        find_documents(open_from_config(cfg), ids=["nope"], doc_index=DocIndex(str(tmp_path / "cache2")))
