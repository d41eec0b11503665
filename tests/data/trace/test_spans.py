"""`olmo-data trace --spans`: two training passages joined by made-up words are reported as two spans, each with
its document and the steps that trained on it (checked against `inspect-batch`), and nothing for the made-up
words; the same with and without `olmo-data index`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.instances import open_from_config
from olmo_data.dataset.order import build_config_orders
from olmo_data.run.batches import inspect_batch
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace.spans import marked_text, trace_spans

MADE_UP = " zorblax quimfendry vortuplex snarggle"


@pytest.fixture(scope="module")
def run(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("spans")
    tokenize(demo_corpus[:2], root / "tokens", TokenizeOptions(tokenizer=demo_tokenizer))
    cfg = {
        "seed": 5,
        "save_folder": str(root / "run"),
        "global_train_batch_size": 16,
        "max_duration": "2ep",
        "model": {"max_sequence_length": 128},
        "data": {"paths": [str(root / "tokens")]},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    build_config_orders(cfg, epochs=2)
    return {"cfg": cfg, "config": str(root / "config.yaml")}


def passages(source: Any, tok: Any, first_row: int, length: int = 40) -> list[tuple[str, str]]:
    """Two passages of two documents of the first token file (from `first_row` on), each as text that encodes back
    to the same tokens and starts with a space, so that joining them with words keeps their tokens."""
    import numpy as np

    f = source.files[0]
    index = DocIndex().index_for(f.path, f.metadata_path)
    tokens = np.memmap(f.path, dtype=np.uint16, mode="r")
    out = []
    for row in range(first_row, first_row + 50):
        doc_id, _, _, start, end = index.doc(row)
        for s in range(start + 40, end - length, 7):
            ids = tokens[s : s + length].tolist()
            text = tok.decode(ids)
            if tok.encode(text) == ids and text.startswith(" ") and not text.endswith(" "):
                out.append((doc_id, text))
                break
        if len(out) == 2:
            return out
    raise AssertionError("no clean passages")


def test_two_passages_and_made_up_words(run: dict[str, Any]) -> None:
    source = open_from_config(run["cfg"])
    tok = data_tokenizer(None, source)
    (doc_a, text_a), (doc_b, text_b) = passages(source, tok, 3)
    text = text_a + MADE_UP + text_b
    outputs = {}
    for mode in ("scan", "index"):
        if mode == "index":
            res = CliRunner().invoke(main, ["index", run["config"]])
            assert res.exit_code == 0 and "indexed 2 token file(s)" in res.output, res.output
        res = CliRunner().invoke(main, ["trace", run["config"], "--spans", text, "--json"])
        assert res.exit_code == 0, res.output
        outputs[mode] = json.loads(res.output)
        assert outputs[mode]["search"]["index"] is (mode == "index")
        outputs[mode].pop("search")
        outputs[mode]["trace"].pop("scan")
        res = CliRunner().invoke(main, ["trace", run["config"], "--spans", text])
        outputs[mode + "-text"] = res.output.splitlines()[1:]  # all but the line that says how it searched
    assert outputs["scan"] == outputs["index"] and outputs["scan-text"] == outputs["index-text"]

    got = outputs["scan"]
    spans = got["spans"]
    assert len(spans) == 2, [s["text"] for s in spans]
    for span, doc_id, passage_text in zip(spans, (doc_a, doc_b), (text_a, text_b), strict=True):
        assert span["end"] - span["start"] >= 30 and span["text"].strip() in passage_text
        assert all(w not in span["text"] for w in MADE_UP.split())
        assert doc_id in {d["id"] for p in span["places"] for d in p["documents"]}
        assert span["steps"] and span["steps"] == sorted({s for p in span["places"] for s in p["steps"]})
    # each reported step's batch holds the span's tokens where the trace says (inspect-batch, independently)
    hits = got["trace"]["hits"]
    targets = got["trace"]["targets"]
    assert {h["step"] for h in hits} == set(spans[0]["steps"]) | set(spans[1]["steps"])
    for h in hits[:12]:
        batch = inspect_batch(run["cfg"], step=h["step"])
        ids = batch.instances[h["position"]].token_ids[h["instance_start"] : h["instance_end"]].tolist()
        span = next(s for s in spans if s["text"] == targets[h["target"]]["name"])
        assert ids == got["tokens"][span["start"] : span["end"]][h["target_start"] : h["target_end"]]
    # the made-up words are outside every mark
    report = trace_spans(run["config"], text)
    marked = marked_text(report)
    assert marked.replace("[[", "").replace("]]", "") == tok.decode(report.tokens)
    between = marked.split("]]")[1].split("[[")[0]
    assert all(w in between for w in MADE_UP.split())


def test_a_span_across_a_document_boundary_names_both_documents(run: dict[str, Any]) -> None:
    import numpy as np

    source = open_from_config(run["cfg"])
    f = source.files[0]
    index = DocIndex().index_for(f.path, f.metadata_path)
    _, _, _, _, end = index.doc(4)  # the last tokens of document 4, its EOS, the first of document 5
    tokens = np.memmap(f.path, dtype=np.uint16, mode="r")[end - 10 : end + 10].tolist()
    report = trace_spans(run["config"], tokens=tokens, use_index=False)
    assert [(s.start, s.end) for s in report.spans] == [(0, 20)]
    place = next(p for p in report.spans[0].places if p.start == end - 10)
    assert [d["id"] for d in place.documents] == [index.doc(4)[0], index.doc(5)[0]]


def test_bad_span_requests(run: dict[str, Any], tmp_path: Path) -> None:
    for args, message in (
        (["--spans", "x", "--text", "y"], "--spans takes a text alone"),
        (["--spans", "some text here", "--min-tokens", "0"], "--min-tokens 0: expected a positive number"),
    ):
        res = CliRunner().invoke(main, ["trace", run["config"], *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    short = CliRunner().invoke(main, ["trace", run["config"], "--spans", " the"])
    assert short.exit_code == 0 and short.output.startswith("0 span(s) of at least 8 tokens")


def test_generate_marks_the_spans_of_a_continuation(
    run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`olmo-train generate --trace`, the model stubbed to continue with a training passage and made-up words:
    the passage is marked, the words are not, and its document is named."""
    import olmo_train.generate as gen
    from olmo_cli.train_main import main as train_main

    source = open_from_config(run["cfg"])
    tok = data_tokenizer(None, source)
    (doc_a, text_a), _ = passages(source, tok, 20)
    continuation = text_a + MADE_UP
    monkeypatch.setattr(gen, "complete_text", lambda *a, **k: gen.TextCompletions([[(0.0, continuation)]], 8, 8, 0.1))
    checkpoint = tmp_path / "step12"
    checkpoint.mkdir()
    (checkpoint / "config.yaml").write_text(Path(run["config"]).read_text())
    res = CliRunner().invoke(train_main, ["generate", str(checkpoint), "--prompt", "x", "--trace"])
    assert res.exit_code == 0, res.output
    expected = marked_text(trace_spans(run["config"], continuation))
    assert res.stdout.startswith(f"x{expected}\n") and expected.startswith("[[") and expected.endswith(MADE_UP)
    listed = res.stdout[len(expected) + 2 :].splitlines()
    assert len(listed) == 1 and listed[0].startswith("  in the training data: ")
    assert doc_a in listed[0] and "; steps " in listed[0] and "(none in the run)" not in listed[0]


def test_the_largest_uint16_token_is_scanned(tmp_path: Path) -> None:
    """Token 65535 in uint16 data: the candidate table's lookup must not compute in uint16 (it overflowed)."""
    import numpy as np

    from olmo_data.trace.spans import find_spans

    tokens = np.random.default_rng(1).integers(0, 50, 1000).astype(np.uint16)
    tokens[5] = 65535
    path = tmp_path / "part-0.npy"
    tokens.tofile(path)
    source = open_from_config({"model": {"max_sequence_length": 16}, "data": {"paths": [str(path)], "dtype": "uint16"}})
    found, _ = find_spans(source, tokens[0:20].astype(int).tolist(), 8)
    assert [(i, j, at[str(path)].tolist(), c) for i, j, at, c in found] == [(0, 20, [0], 1)]


def test_spans_need_a_text_or_token_ids(run: dict[str, Any]) -> None:
    from olmo_data.errors import DataError

    with pytest.raises(DataError, match="neither was given"):
        trace_spans(run["config"], None)
    with pytest.raises(DataError, match=r"^--spans: token id -1 is outside 0\.\.\d+,"):
        trace_spans(run["config"], tokens=[3, -1])
