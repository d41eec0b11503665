"""`olmo-data trace`: provenance in reverse agrees with a brute-force walk of every step's batch, across epochs and
through a mixture that repeats a source; a passage is found at the steps `inspect-batch` shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.instances import InstanceSource, open_from_config
from olmo_data.dataset.mixture import build_mix, parse_spec
from olmo_data.dataset.order import (
    batches_per_epoch,
    build_config_orders,
    build_order,
    load_order,
    order_path_for_epoch,
)
from olmo_data.run.batches import inspect_batch
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.trace.find import find_documents, trace

SEQ, GBS = 256, 32
Key = tuple[int, int, str, int, int, int]  # step, position, document id, instance span, offset in the document


@pytest.fixture(scope="module")
def tokens(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace") / "tokens"
    tokenize(demo_corpus, out, TokenizeOptions(tokenizer=demo_tokenizer))
    return out


def config(tmp_path: Path, data: dict[str, Any], **kw: Any) -> dict[str, Any]:
    cfg = {
        "seed": 11,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": GBS,
        "max_duration": "2ep",
        "model": {"max_sequence_length": SEQ},
        "data": data,
        **kw,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return cfg


def brute_force(cfg: dict[str, Any], source: InstanceSource, keep: Any, epochs: int) -> set[Key]:
    """Every (step, position) of every epoch, each instance's documents looked up one by one."""
    docs, n = DocIndex(), len(source)
    per_epoch = batches_per_epoch(n, GBS)
    out: set[Key] = set()
    for epoch in range(epochs):
        path = order_path_for_epoch(str(Path(cfg["save_folder"]) / "train_data"), epoch)
        order = load_order(path) if Path(path).exists() else build_order(n, int(cfg["seed"]), epoch)
        for p in range(per_epoch * GBS):
            loc = source.locate_many([int(order[p])])[0]
            metadata = source.files[loc.file_index].metadata_path
            for d in docs.lookup(loc.path, loc.token_offset, loc.token_offset + SEQ, metadata) or []:
                if keep(d):
                    step = epoch * per_epoch + p // GBS + 1
                    out.add((step, p % GBS, d.id, d.instance_start, d.instance_end, d.document_start))
    return out


def traced(report: Any) -> set[Key]:
    names = [t.name for t in report.targets]
    return {
        (h.step, h.position, names[h.target], h.instance_start, h.instance_end, h.target_start) for h in report.hits
    }


def test_every_document_of_a_file_over_two_epochs(tokens: Path, demo_corpus: list[str], tmp_path: Path) -> None:
    cfg = config(tmp_path, {"paths": [str(tokens)]})
    build_config_orders(cfg)  # epoch 0 from its file; epoch 1's order is rebuilt in memory, as the trainer would
    source = open_from_config(cfg)
    src = demo_corpus[1]
    report = trace(cfg, find_documents(source, source_glob=f"*{Path(src).name}"), source=source, world_size=4)
    expected = brute_force(cfg, source, lambda d: d.src == src, epochs=2)
    assert len(expected) > 50 and traced(report) == expected
    assert {h.epoch for h in report.hits} == {0, 1}
    assert all(h.rank == h.position % 4 for h in report.hits)
    # a step range narrows it; one document by id is a subset
    some = sorted(expected)[len(expected) // 2]
    narrow = trace(cfg, find_documents(source, [some[2]]), source=source, steps=(some[0], some[0]))
    assert (some[0], some[1], some[2], some[3], some[4], some[5]) in traced(narrow)
    assert {h.step for h in narrow.hits} == {some[0]}


def test_through_a_mixture_that_repeats_a_source(tokens: Path, tmp_path: Path) -> None:
    files = sorted(str(p) for p in tokens.glob("*.npy"))
    n = len(open_from_config({"model": {"max_sequence_length": SEQ}, "data": {"paths": [str(tokens)]}}))
    spec = {  # the first part file is also a source of its own, repeated about 3.6 times to fill its share
        "seed": 2,
        "sequence_length": SEQ,
        "total_tokens": 3 * n * SEQ,
        "sources": [
            {"name": "all", "paths": [str(tokens)], "share": 0.6},
            {"name": "again", "paths": files[:1], "share": 0.4},
        ],
    }
    build_mix(parse_spec(spec), str(tmp_path / "mix"))
    cfg = config(tmp_path, {"mix": str(tmp_path / "mix")}, max_duration="1ep")
    source = open_from_config(cfg)
    index = DocIndex().index_for(files[0])
    assert index is not None
    doc_id = index.doc(3)[0]
    report = trace(cfg, find_documents(source, [doc_id]), source=source)
    expected = brute_force(cfg, source, lambda d: d.id == doc_id, epochs=1)
    assert expected and traced(report) == expected
    assert len({t.file_index for t in report.targets}) == 2  # found in both sources' copies of the file
    copies: dict[tuple[int, int], set[int]] = {}
    for h in report.hits:  # the same tokens, trained through several dataset instances: the repetition
        copies.setdefault((h.target, h.target_start), set()).add(h.instance)
    assert max(len(v) for v in copies.values()) > 1


def test_a_passage_is_found_where_inspect_batch_shows_it(tokens: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, {"paths": [str(tokens)]})
    build_config_orders(cfg)
    batch = inspect_batch(cfg, step=3, decode=True)
    ids = batch.instances[5].token_ids[40:52].tolist()
    res = CliRunner().invoke(
        main, ["trace", str(tmp_path / "config.yaml"), "--tokens", ",".join(map(str, ids)), "--json"]
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    places = {(h["step"], h["position"], h["instance_start"], h["instance_end"]) for h in got["hits"]}
    assert (3, 5, 40, 52) in places
    assert got["scan"]["tokens"] > 0
    # the same as text, encoded with the tokenizer the manifest records
    from olmo_data.tokenizer import data_tokenizer

    tok = data_tokenizer(None, open_from_config(cfg))
    start = next(
        s
        for s in range(30, 60)
        if tok.encode(tok.decode(batch.instances[5].token_ids[s : s + 12].tolist()))
        == batch.instances[5].token_ids[s : s + 12].tolist()
    )
    text = tok.decode(batch.instances[5].token_ids[start : start + 12].tolist())
    res = CliRunner().invoke(main, ["trace", str(tmp_path / "config.yaml"), "--text", text, "--steps", "1..5"])
    assert res.exit_code == 0, res.output
    assert (
        "step 3 (epoch 0, batch 2)" in res.output
        and f"position 5: instance {batch.instances[5].instance} tokens [{start}, {start + 12})" in res.output
    )


def test_bad_requests_are_named(tokens: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, {"paths": [str(tokens)]})
    path = str(tmp_path / "config.yaml")
    for args, message in (
        (["--document", "no-such-doc"], "document id 'no-such-doc' not found"),
        ([], "give documents (--document, --document-list, --source) or one of --text and --tokens"),
        (["--document", "x", "--text", "y"], "give documents"),
        (["--source", "*nothing*"], "no document of the run's token files comes from a source file matching"),
        (["--tokens", "1,a"], "--tokens '1,a': expected token ids"),
        (["--document-list", str(tmp_path / "missing.txt")], "missing.txt: cannot read the id list"),
    ):
        res = CliRunner().invoke(main, ["trace", path, *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    source = open_from_config(cfg)
    some = find_documents(source, source_glob="*")[:1]
    with pytest.raises(Exception, match=r"--world-size 3 must divide the global batch size 32"):
        trace(cfg, some, source=source, world_size=3)
    with pytest.raises(Exception, match=r"--steps 5..2"):
        trace(cfg, some, source=source, steps=(5, 2))


def test_sft_data_says_which_traced_tokens_were_supervised(demo_tokenizer: str, tmp_path: Path) -> None:
    from olmo_data.chat import ChatOptions, prepare_chat
    from olmo_data.demo import make_demo_chat

    chat = make_demo_chat(tmp_path / "chat.jsonl", max_files=40)
    prepare_chat([chat], tmp_path / "sft", ChatOptions(tokenizer=demo_tokenizer, seq_len=64, pack=True))
    cfg = config(tmp_path, {"paths": [str(tmp_path / "sft")]}, global_train_batch_size=4, max_duration="1ep")
    cfg["model"]["max_sequence_length"] = 64
    source = open_from_config(cfg)
    targets = find_documents(source, source_glob="*")
    report = trace(cfg, targets, source=source)
    assert report.hits and all(h.supervised is not None for h in report.hits)
    for h in report.hits[:20]:  # the count is the label mask's over the traced span of the instance
        _, masks = source.get_batch([h.instance])
        assert masks is not None
        assert h.supervised == int(masks[0][h.instance_start : h.instance_end].sum())
    assert 0 < sum(h.supervised or 0 for h in report.hits) < sum(h.instance_end - h.instance_start for h in report.hits)
