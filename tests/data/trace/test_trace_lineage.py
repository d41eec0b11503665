"""`olmo-data trace` across stages: a stage-2 run that loaded a stage-1 checkpoint reports a stage-1 document at
exactly the steps `trace` of stage 1 itself reports, up to the checkpoint's step; through lineage records, soups
and plain resumes; unreachable parents are a note, not a crash; `lineage` and `inspect-batch` show tokens per
stage. The checkpoints are fakes (config.yaml + trainer_state.json), all the data side reads of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.instances import open_from_config
from olmo_data.dataset.order import build_config_orders, build_order
from olmo_data.errors import DataError
from olmo_data.run.batches import inspect_batch
from olmo_data.run.lineage import lineage_of_config
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.trace.find import find_documents, trace
from olmo_data.trace.stages import trace_chain

ROOT = Path(__file__).resolve().parents[3]
SEQ, GBS, PARENT_STEP = 128, 8, 12


@pytest.fixture(scope="module")
def corpora(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two token directories of different documents: stage 1's (shard 0) and stage 2's (shard 1)."""
    root = tmp_path_factory.mktemp("stages")
    out = []
    for k in range(2):
        tokenize([demo_corpus[k]], root / f"tokens{k + 1}", TokenizeOptions(tokenizer=demo_tokenizer))
        out.append(root / f"tokens{k + 1}")
    return out


def write_config(path: Path, data: Path, run_name: str, save_folder: Path, **kw: Any) -> dict[str, Any]:
    cfg = {
        "run_name": run_name,
        "seed": kw.pop("seed", 11),
        "save_folder": str(save_folder),
        "global_train_batch_size": GBS,
        "max_duration": kw.pop("max_duration", 40),
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": [str(data)]},
        **kw,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return cfg


def fake_checkpoint(cfg: dict[str, Any], step: int, lineage: list[dict[str, Any]] | None = None) -> Path:
    """save_folder/stepN with the run's config.yaml and a trainer_state.json (with `lineage` when given)."""
    ckpt = Path(cfg["save_folder"]) / f"step{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg))
    state = {
        "step": step,
        "tokens_seen": step * GBS * SEQ,
        "run_name": cfg["run_name"],
        "data_fingerprint": open_from_config(cfg).fingerprint(),
        "seed": cfg["seed"],
        "global_train_batch_size": GBS,
        "sequence_length": SEQ,
    }
    if lineage is not None:
        state["lineage"] = lineage
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return ckpt


def record(ckpt: Path, given: str | None = None, weight: float | None = None) -> dict[str, Any]:
    """The lineage record the trainer writes for a run started from `ckpt` (or `olmo-train soup` for a parent)."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    return {
        "source": "checkpoint" if weight is None else "soup",
        "given": given or str(ckpt),
        "resolved": str(ckpt.resolve()),
        "run_name": state["run_name"],
        "data_fingerprint": state["data_fingerprint"],
        "step": state["step"],
        "tokens_seen": state["tokens_seen"],
        "weight": weight,
        "lineage": state.get("lineage", []),
    }


def hits_of(report: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(h["step"], h["position"], h["instance"]) for h in report["hits"]]


def busy_document(cfg: dict[str, Any], last: int) -> str:
    """A stage-1 document trained both up to `last` and after it (so truncation is seen)."""
    source = open_from_config(cfg)
    targets = find_documents(source, source_glob="*")
    report = trace(cfg, targets, source=source)
    steps: dict[int, set[int]] = {}
    for h in report.hits:
        steps.setdefault(h.target, set()).add(h.step)
    for t, s in steps.items():
        if min(s) <= last < max(s):
            return targets[t].name
    raise AssertionError("no document trained both before and after the parent's step")


@pytest.fixture()
def two_stages(corpora: list[Path], tmp_path: Path) -> dict[str, Any]:
    """Stage 1 (its config and a checkpoint at PARENT_STEP, no lineage field, as today's checkpoints) and a
    stage-2 config that loads it and restarts on other data (restore_dataloader: false)."""
    cfg1 = write_config(tmp_path / "stage1.yaml", corpora[0], "stage1", tmp_path / "run1")
    ckpt1 = fake_checkpoint(cfg1, PARENT_STEP)
    given = str(ckpt1)
    cfg2 = write_config(
        tmp_path / "stage2.yaml", corpora[1], "stage2", tmp_path / "run2", seed=5, load_path=given,
        restore_dataloader=False, max_duration=10,
    )  # fmt: skip
    return {"cfg1": cfg1, "cfg2": cfg2, "ckpt1": ckpt1, "dir": tmp_path}


def cli(*args: str) -> Any:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout  # (the loopback HTTP server logs its requests to stderr)


def test_stage1_document_in_stage2_trace_is_stage1s_trace_to_the_parent_step(two_stages: dict[str, Any]) -> None:
    d = two_stages["dir"]
    doc = busy_document(two_stages["cfg1"], PARENT_STEP)
    out = json.loads(cli("trace", str(d / "stage2.yaml"), "--document", doc, "--json"))
    assert [s["run_name"] for s in out["stages"]] == ["stage2", "stage1"]
    own, parent = out["stages"]
    assert own["report"]["targets"] == [] and out["hits"] == []  # not in stage 2's data
    assert parent["config"] == str(two_stages["ckpt1"] / "config.yaml")
    assert parent["checkpoint"] == str(two_stages["ckpt1"]) and parent["checkpoint_step"] == PARENT_STEP
    # trace of stage 1 run directly, over its whole run, then cut at the parent's step
    alone = json.loads(cli("trace", str(d / "stage1.yaml"), "--document", doc, "--json"))
    expected = [h for h in hits_of(alone) if h[0] <= PARENT_STEP]
    assert expected and len(expected) < len(hits_of(alone))  # the cut drops later stage-1 steps
    assert hits_of(parent["report"]) == expected
    # tokens per stage: steps x batch tokens; the total their sum
    assert own["tokens_trained"] == 10 * GBS * SEQ and parent["tokens_trained"] == PARENT_STEP * GBS * SEQ
    assert out["tokens_total"] == (10 + PARENT_STEP) * GBS * SEQ
    text = cli("trace", str(d / "stage2.yaml"), "--document", doc)
    assert "run 'stage1'" in text and f"steps 1..{PARENT_STEP}" in text


def test_stage2_document_and_no_lineage(two_stages: dict[str, Any]) -> None:
    d, cfg2 = two_stages["dir"], two_stages["cfg2"]
    source = open_from_config(cfg2)
    doc = find_documents(source, source_glob="*")[3].name
    chain = trace_chain(str(d / "stage2.yaml"), document_ids=[doc])
    alone = trace(cfg2, find_documents(source, [doc]), source=source)
    assert chain.own.hits == alone.hits and chain.stages[1].report is not None
    assert chain.stages[1].report.targets == []  # not in stage 1's data
    one = json.loads(cli("trace", str(d / "stage2.yaml"), "--document", doc, "--json", "--no-lineage"))
    assert len(one["stages"]) == 1 and hits_of(one) == hits_of(chain.to_json())
    # a stage-1 document with --no-lineage is not in this run's data: an error naming it
    r = CliRunner().invoke(main, ["trace", str(d / "stage2.yaml"), "--no-lineage", "--document", "nope:1"])
    assert r.exit_code == 2 and "nope:1" in r.output


def test_lineage_records_through_three_stages_and_a_save_folder_config(
    two_stages: dict[str, Any], corpora: list[Path]
) -> None:
    """Stage 2's checkpoint records its lineage; stage 3 loads it (reset_trainer_state). The save folder's
    config.yaml of stage 2 (no load_path in it) finds stage 1 through its checkpoints' lineage."""
    d, ckpt1 = two_stages["dir"], two_stages["ckpt1"]
    cfg2 = dict(two_stages["cfg2"])
    cfg2.pop("load_path")
    ckpt2 = fake_checkpoint(cfg2, 6, lineage=[record(ckpt1)])
    (Path(cfg2["save_folder"]) / "config.yaml").write_text(yaml.safe_dump(cfg2))
    write_config(
        d / "stage3.yaml", corpora[0], "stage3", d / "run3", seed=7, load_path=str(ckpt2), reset_trainer_state=True
    )
    doc = busy_document(two_stages["cfg1"], PARENT_STEP)
    alone = json.loads(
        cli("trace", str(d / "stage1.yaml"), "--document", doc, "--json", "--steps", f"1..{PARENT_STEP}")
    )
    out = json.loads(cli("trace", str(d / "stage3.yaml"), "--document", doc, "--json"))
    assert [(s["run_name"], s["parent_of"], s["last_step"]) for s in out["stages"]] == [
        ("stage3", None, 40),
        ("stage2", 0, 6),
        ("stage1", 1, PARENT_STEP),
    ]
    assert hits_of(out["stages"][2]["report"]) == hits_of(alone)
    assert out["stages"][1]["report"]["targets"] == []
    saved = json.loads(cli("trace", str(Path(cfg2["save_folder"]) / "config.yaml"), "--document", doc, "--json"))
    assert [s["run_name"] for s in saved["stages"]] == ["stage2", "stage1"]
    assert hits_of(saved["stages"][1]["report"]) == hits_of(alone)


def test_a_plain_resume_is_one_stage(two_stages: dict[str, Any], corpora: list[Path]) -> None:
    """load_path to stage 1's checkpoint with the same data, seed and batch, no reset: the same run, continued."""
    d, cfg1 = two_stages["dir"], two_stages["cfg1"]
    write_config(d / "resume.yaml", corpora[0], "stage1", d / "elsewhere", load_path=str(two_stages["ckpt1"]))
    doc = busy_document(cfg1, PARENT_STEP)
    out = json.loads(cli("trace", str(d / "resume.yaml"), "--document", doc, "--json"))
    alone = json.loads(cli("trace", str(d / "stage1.yaml"), "--document", doc, "--json"))
    assert len(out["stages"]) == 1 and hits_of(out) == hits_of(alone)
    # ... but a stage 2 that resumed the plain resume still reaches stage 1, through it
    write_config(
        d / "s2.yaml", corpora[1], "s2", d / "run-s2", seed=3, load_path=str(fake_checkpoint(
            yaml.safe_load((d / "resume.yaml").read_text()), 20)), restore_dataloader=False,
    )  # fmt: skip
    chain = json.loads(cli("trace", str(d / "s2.yaml"), "--document", doc, "--json"))
    assert [(s["run_name"], s["last_step"]) for s in chain["stages"]] == [("s2", 40), ("stage1", 20)]
    assert hits_of(chain["stages"][1]["report"]) == [h for h in hits_of(alone) if h[0] <= 20]


def test_a_soup_traces_each_parent(two_stages: dict[str, Any], corpora: list[Path]) -> None:
    d, ckpt1 = two_stages["dir"], two_stages["ckpt1"]
    cfg1b = write_config(d / "stage1b.yaml", corpora[0], "stage1b", d / "run1b", seed=99)
    ckpt1b = fake_checkpoint(cfg1b, 9)
    soup = d / "soup"
    soup.mkdir()
    (soup / "trainer_state.json").write_text(
        json.dumps({"step": 0, "run_name": "soup", "lineage": [record(ckpt1, weight=0.5), record(ckpt1b, weight=0.5)]})
    )
    write_config(d / "ft.yaml", corpora[1], "ft", d / "run-ft", load_path=str(soup), reset_trainer_state=True)
    doc = busy_document(two_stages["cfg1"], PARENT_STEP)
    out = json.loads(cli("trace", str(d / "ft.yaml"), "--document", doc, "--json"))
    assert [(s["run_name"], s["depth"], s["steps"], s["weight"]) for s in out["stages"]] == [
        ("ft", 0, 40, None),
        ("soup", 1, 0, None),
        ("stage1", 2, PARENT_STEP, 0.5),
        ("stage1b", 2, 9, 0.5),
    ]
    for stage, cfg_path, last in (
        (out["stages"][2], "stage1.yaml", PARENT_STEP),
        (out["stages"][3], "stage1b.yaml", 9),
    ):
        alone = json.loads(cli("trace", str(d / cfg_path), "--document", doc, "--json", "--steps", f"1..{last}"))
        assert hits_of(stage["report"]) == hits_of(alone)
    assert out["tokens_total"] == (40 + PARENT_STEP + 9) * GBS * SEQ
    # an imported checkpoint (step 0, its config's load_path the checkpoint itself) is a stage with no steps
    imported = d / "imported"
    imported.mkdir()
    (imported / "config.yaml").write_text(yaml.safe_dump({"run_name": "imported", "load_path": str(imported)}))
    (imported / "trainer_state.json").write_text(json.dumps({"step": 0, "run_name": "imported"}))
    write_config(d / "ft2.yaml", corpora[1], "ft2", d / "run-ft2", load_path=str(imported), reset_trainer_state=True)
    stages = lineage_of_config(str(d / "ft2.yaml"))
    assert [(s.run_name, s.steps, s.note) for s in stages] == [("ft2", 40, None), ("imported", 0, None)]


def test_unreachable_parents_are_a_note(two_stages: dict[str, Any], corpora: list[Path]) -> None:
    d = two_stages["dir"]
    gone = d / "run1" / "step5"  # never written: a deleted checkpoint
    lost = write_config(
        d / "lost.yaml", corpora[1], "lost", d / "run-lost", load_path=str(gone), reset_trainer_state=True
    )
    doc = busy_document(lost, 5)
    out = json.loads(cli("trace", str(d / "lost.yaml"), "--document", doc, "--json"))
    assert out["hits"] and "not reachable" in out["stages"][1]["not_traced"]
    assert "not reachable" in cli("trace", str(d / "lost.yaml"), "--document", doc)
    # a record whose checkpoint was deleted still names the run and its tokens; its own parents are still followed
    ckpt2 = fake_checkpoint(two_stages["cfg2"], 4, lineage=[record(two_stages["ckpt1"])])
    rec = record(ckpt2)
    shutil.rmtree(ckpt2)
    write_config(d / "after.yaml", corpora[1], "after", d / "run-after", reset_trainer_state=True)
    fake_checkpoint(yaml.safe_load((d / "after.yaml").read_text()), 2, lineage=[rec])
    stages = lineage_of_config(str(d / "after.yaml"))
    assert [(s.run_name, s.note is not None) for s in stages] == [("after", False), ("stage2", True), ("stage1", False)]
    assert stages[1].tokens_trained == 4 * GBS * SEQ  # from the record's tokens_seen


def test_damaged_lineage_is_one_error_naming_file_and_key(two_stages: dict[str, Any], corpora: list[Path]) -> None:
    d = two_stages["dir"]
    write_config(d / "bad.yaml", corpora[1], "bad", d / "run-bad")
    ckpt = fake_checkpoint(yaml.safe_load((d / "bad.yaml").read_text()), 1, lineage=[{"source": "checkpoint"}])
    with pytest.raises(DataError, match=r"trainer_state.json: lineage\[0\].resolved"):
        lineage_of_config(str(d / "bad.yaml"))
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"step": 1, "lineage": [record(two_stages["ckpt1"]) | {"step": "x"}]})
    )
    r = CliRunner().invoke(main, ["lineage", str(d / "bad.yaml")])
    assert r.exit_code == 2 and "lineage[0].step" in r.output


def test_lineage_and_inspect_batch_of_a_stage2_step(two_stages: dict[str, Any]) -> None:
    d, cfg2 = two_stages["dir"], two_stages["cfg2"]
    out = json.loads(cli("lineage", str(d / "stage2.yaml"), "--json"))
    assert [(s["run_name"], s["tokens_trained"]) for s in out["stages"]] == [
        ("stage2", 10 * GBS * SEQ),
        ("stage1", PARENT_STEP * GBS * SEQ),
    ]
    assert out["tokens_total"] == sum(s["tokens_trained"] for s in out["stages"])
    build_config_orders(cfg2)  # what the stage-2 run writes into its own save folder
    report = inspect_batch(str(d / "stage2.yaml"), step=3)
    alone = inspect_batch(cfg2, step=3)  # the config as a dict: no lineage read, same batch
    assert report.batch_fingerprint == alone.batch_fingerprint and alone.lineage is None
    assert report.lineage is not None and [s["run_name"] for s in report.lineage] == ["stage2", "stage1"]
    text = cli("inspect-batch", str(d / "stage2.yaml"), "--step", "3")
    assert "run 'stage1'" in text and f"{(10 + PARENT_STEP) * GBS * SEQ:,}" in text


def test_a_passage_and_a_source_glob_across_stages(two_stages: dict[str, Any]) -> None:
    """--tokens and --source are traced in each stage's own data, as trace of that stage alone finds them."""
    d, cfg1 = two_stages["dir"], two_stages["cfg1"]
    source = open_from_config(cfg1)
    first = int(build_order(len(source), int(cfg1["seed"]), 0)[0])  # stage 1's step 1 trained this instance
    passage = ",".join(map(str, source.get_batch([first])[0][0][10:18].tolist()))
    glob = f"*{Path(find_documents(source, source_glob='*')[0].src or '').name}"
    for option, value in (("--tokens", passage), ("--source", glob)):
        out = json.loads(cli("trace", str(d / "stage2.yaml"), option, value, "--json"))
        alone = json.loads(
            cli("trace", str(d / "stage1.yaml"), option, value, "--json", "--steps", f"1..{PARENT_STEP}")
        )
        assert hits_of(out["stages"][1]["report"]) == hits_of(alone) and alone["hits"], option
    r = CliRunner().invoke(main, ["trace", str(d / "stage2.yaml"), "--document", "nope:1"])
    assert r.exit_code == 2 and "'nope:1' not found" in r.output and "any stage" in r.output


def test_a_parent_checkpoint_at_a_url(two_stages: dict[str, Any], corpora: list[Path], http_root: Any) -> None:
    """A parent checkpoint kept in a store (here a loopback HTTP server) is read there; a missing one is a note."""
    d, ckpt1 = two_stages["dir"], two_stages["ckpt1"]
    www, base = http_root
    shutil.copytree(ckpt1, www / "stage1" / "step12")
    for name, url in (("remote", f"{base}/stage1/step12"), ("missing", f"{base}/stage1/step99")):
        write_config(d / f"{name}.yaml", corpora[1], name, d / f"run-{name}", load_path=url, reset_trainer_state=True)
    doc = busy_document(two_stages["cfg1"], PARENT_STEP)
    alone = json.loads(
        cli("trace", str(d / "stage1.yaml"), "--document", doc, "--json", "--steps", f"1..{PARENT_STEP}")
    )
    out = json.loads(cli("trace", str(d / "remote.yaml"), "--document", doc, "--json"))
    assert out["stages"][1]["checkpoint"] == f"{base}/stage1/step12"
    assert out["stages"][1]["config"] == f"{base}/stage1/step12/config.yaml"
    assert hits_of(out["stages"][1]["report"]) == hits_of(alone)
    gone = json.loads(cli("trace", str(d / "missing.yaml"), "--document", doc, "--json"))
    assert gone["stages"][1]["report"] is None and "not reachable" in gone["stages"][1]["not_traced"]


@pytest.mark.slow
def test_with_real_training_a_stage2_run_traces_back_to_stage1(corpora: list[Path], tmp_path: Path) -> None:
    """Today's trainer: stage 1 trains 4 steps, stage 2 loads its step-2 checkpoint (reset_trainer_state, other
    data). trace of stage 2's config names stage 1's run and its steps up to 2, as trace of stage 1 reports them;
    inspect-batch of a stage-2 step from its config gives the batch fingerprint the stage-2 run logged."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    common = {
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 4,
        "save_interval": 2,
        "max_duration": 4,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "vocab_size": 2048, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
    }
    paths = []
    for k, extra in ((1, {}), (2, {"reset_trainer_state": True})):
        cfg = {"run_name": f"real{k}", "seed": 10 + k, "save_folder": str(tmp_path / f"run{k}"), **common, **extra}
        cfg["data"] = {"paths": [str(corpora[k - 1])]}
        if k == 2:
            cfg["load_path"] = str(next(p for p in (tmp_path / "run1").iterdir() if p.name.startswith("step2")))
        paths.append(tmp_path / f"real{k}.yaml")
        paths[-1].write_text(yaml.safe_dump(cfg))
        proc = subprocess.run(
            [sys.executable, "-m", "olmo_train", str(paths[-1])],
            cwd=repo,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            text=True,
            capture_output=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg1 = yaml.safe_load(paths[0].read_text())
    source = open_from_config(cfg1)
    report = trace(cfg1, find_documents(source, source_glob="*"), source=source, steps=(1, 2))
    doc = report.targets[report.hits[0].target].name
    alone = json.loads(cli("trace", str(paths[0]), "--document", doc, "--json", "--steps", "1..2"))
    out = json.loads(cli("trace", str(paths[1]), "--document", doc, "--json"))
    assert [(s["run_name"], s["last_step"]) for s in out["stages"]] == [("real2", 4), ("real1", 2)]
    assert out["stages"][1]["not_traced"] is None and hits_of(out["stages"][1]["report"]) == hits_of(alone)
    logged = {
        r["step"]: r["train/batch_fingerprint"]
        for r in map(json.loads, (tmp_path / "run2" / "metrics.jsonl").read_text().splitlines())
        if "train/batch_fingerprint" in r
    }
    assert logged[3] == inspect_batch(str(paths[1]), step=3).batch_fingerprint


def real_run(path: Path, cfg: dict[str, Any]) -> None:
    """One real training run of `cfg` (written to `path`), as a user starts one (`python -m olmo_train`): the
    trainer writes its checkpoints' trainer_state.json (lineage included) as any run does."""
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "olmo_train", str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_real_stage2_runs_and_their_soup_trace_and_count_back_to_stage1(corpora: list[Path], tmp_path: Path) -> None:
    """Issue 24's Done-when with real runs: stage 1 trains 6 steps (checkpoints at 2, 4, 6); two anneals load its
    step-4 checkpoint (not the last) with restore_dataloader: false on other data, their trainer writing the
    lineage record; trace of an anneal's save-folder config.yaml reports a stage-1 document at exactly the steps
    trace of stage 1 reports up to 4 (a later step of it is left out); a config loading the soup of the two
    anneals lists both anneals and stage 1 once, with tokens as the runs' trainer_state.json count them."""
    from olmo_cli.train_main import main as train_cli

    s1, parent_step, s2 = 6, 4, 3
    common: dict[str, Any] = {
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": GBS,
        "save_interval": 2,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "vocab_size": 2048, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
    }
    cfg1 = {"run_name": "stage1", "seed": 11, "save_folder": str(tmp_path / "run1"), "max_duration": s1, **common}
    cfg1["data"] = {"paths": [str(corpora[0])]}
    real_run(tmp_path / "stage1.yaml", cfg1)
    parent = tmp_path / "run1" / f"step{parent_step}"
    anneals = []
    for seed in (42, 666):
        cfg = {"run_name": f"anneal{seed}", "seed": seed, "save_folder": str(tmp_path / f"anneal{seed}"), **common}
        cfg |= {"max_duration": s2, "load_path": str(parent), "restore_dataloader": False}
        cfg["data"] = {"paths": [str(corpora[1])]}
        real_run(tmp_path / f"anneal{seed}.yaml", cfg)
        anneals.append(tmp_path / f"anneal{seed}")
    last = anneals[0] / f"step{s2}"
    (record,) = json.loads((last / "trainer_state.json").read_text())["lineage"]  # written by the trainer
    assert (record["run_name"], record["step"], record["resolved"]) == ("stage1", parent_step, str(parent.resolve()))

    doc = busy_document(cfg1, parent_step)  # a stage-1 document trained both up to step 4 and after it
    alone = hits_of(json.loads(cli("trace", str(tmp_path / "stage1.yaml"), "--document", doc, "--json")))
    out = json.loads(cli("trace", str(anneals[0] / "config.yaml"), "--document", doc, "--json"))
    assert [(s["run_name"], s["last_step"]) for s in out["stages"]] == [("anneal42", s2), ("stage1", parent_step)]
    assert out["stages"][1]["checkpoint"] == str(parent.resolve()) and out["stages"][1]["not_traced"] is None
    assert hits_of(out["stages"][1]["report"]) == [h for h in alone if h[0] <= parent_step]
    assert any(h[0] > parent_step for h in alone)  # stage 1 alone trained it later too; those steps are left out

    soup = tmp_path / "soup"
    r = CliRunner().invoke(train_cli, ["soup", *(str(a / f"step{s2}") for a in anneals), "--destination", str(soup)])
    assert r.exit_code == 0, r.output
    ft = {"run_name": "ft", "seed": 1, "save_folder": str(tmp_path / "ft"), "max_duration": 2, **common}
    ft |= {"load_path": str(soup), "reset_trainer_state": True, "data": {"paths": [str(corpora[1])]}}
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump(ft))
    listed = json.loads(cli("lineage", str(tmp_path / "ft.yaml"), "--json"))["stages"]
    assert sorted(s["run_name"] for s in listed) == ["anneal42", "anneal666", "ft", "soup", "stage1"]
    seen = {s["run_name"]: s["tokens_trained"] for s in listed}
    for a in anneals:
        assert seen[a.name] == json.loads((a / f"step{s2}" / "trainer_state.json").read_text())["tokens_seen"]
    stage1_tokens = json.loads((parent / "trainer_state.json").read_text())["tokens_seen"]
    assert seen["stage1"] == stage1_tokens == parent_step * GBS * SEQ and seen["soup"] == 0
    total = json.loads(cli("lineage", str(tmp_path / "ft.yaml"), "--json"))["tokens_total"]
    assert total == 2 * GBS * SEQ + 2 * s2 * GBS * SEQ + stage1_tokens
    # trace through the soup: both anneals traced over their steps, stage 1 once, up to step 4
    out = json.loads(cli("trace", str(tmp_path / "ft.yaml"), "--document", doc, "--json"))
    by_name = {s["run_name"]: s for s in out["stages"]}
    assert [by_name[a.name]["last_step"] for a in anneals] == [s2, s2]
    assert all(by_name[a.name]["not_traced"] is None for a in anneals)
    assert hits_of(by_name["stage1"]["report"]) == [h for h in alone if h[0] <= parent_step]
    assert by_name["stage1"]["also_loaded_by"] == [by_name["anneal666"]["index"]]


def test_a_shared_stage1_reached_by_its_sharded_and_unsharded_copy_is_one_stage(
    two_stages: dict[str, Any], corpora: list[Path]
) -> None:
    """Two anneals of a soup, one loaded from stage 1's stepN/, the other from its stepN-unsharded/ copy: the
    same weights, so stage 1 is one stage (loaded by both) and its tokens count once."""
    d, ckpt1 = two_stages["dir"], two_stages["ckpt1"]
    copy = ckpt1.with_name(f"{ckpt1.name}-unsharded")
    shutil.copytree(ckpt1, copy)
    anneals = []
    for name, parent, seed in (("a", ckpt1, 1), ("b", copy, 2)):
        cfg = write_config(
            d / f"{name}.yaml", corpora[1], name, d / f"run-{name}", seed=seed, load_path=str(parent),
            restore_dataloader=False, max_duration=4,
        )  # fmt: skip
        anneals.append(fake_checkpoint(cfg, 4, lineage=[record(parent)]))
    soup = d / "soup2"
    soup.mkdir()
    lineage = [record(a, weight=0.5) for a in anneals]
    (soup / "trainer_state.json").write_text(json.dumps({"step": 0, "run_name": "soup2", "lineage": lineage}))
    write_config(d / "ft.yaml", corpora[1], "ft", d / "run-ft", load_path=str(soup), reset_trainer_state=True)
    stages = lineage_of_config(str(d / "ft.yaml"))
    assert [s.run_name for s in stages] == ["ft", "soup2", "a", "stage1", "b"]
    assert stages[3].also_loaded_by == [4]
    assert sum(s.tokens_trained or 0 for s in stages) == (40 + 4 + PARENT_STEP + 4) * GBS * SEQ


def test_a_records_counters_key_says_whether_the_child_continued(
    two_stages: dict[str, Any], corpora: list[Path]
) -> None:
    """A child on stage 1's data, seed and batch with no reset keys looks like a plain resume; its record's
    `counters` (written by the trainer from what it restored) decides, and an older record without it is guessed
    from the config as before."""
    d, ckpt1 = two_stages["dir"], two_stages["ckpt1"]
    cfg = write_config(d / "c.yaml", corpora[0], "stage1", d / "run-c", load_path=str(ckpt1), max_duration=20)
    saved = fake_checkpoint(cfg, 20, lineage=[record(ckpt1)])
    state_file = saved / "trainer_state.json"
    assert len(lineage_of_config(str(d / "c.yaml"))) == 1  # no key: guessed a plain resume
    for counters, n in (("continued", 1), ("restarted", 2)):
        state = json.loads(state_file.read_text())
        state["lineage"][0]["counters"] = counters
        state_file.write_text(json.dumps(state))
        stages = lineage_of_config(str(d / "c.yaml"))
        assert len(stages) == n, counters
    assert [(s.run_name, s.first_step, s.last_step) for s in stages] == [("stage1", 1, 20), ("stage1", 1, PARENT_STEP)]
    state["lineage"][0]["counters"] = "maybe"
    state_file.write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"trainer_state.json: lineage\[0\]\.counters must be continued, restarted"):
        lineage_of_config(str(d / "c.yaml"))


def test_lineage_counts_the_runs_saved_steps_or_its_planned_ones_up_to_stop_at(
    two_stages: dict[str, Any], corpora: list[Path]
) -> None:
    d = two_stages["dir"]
    cfg = write_config(d / "s.yaml", corpora[1], "s", d / "run-s", max_duration=40, stop_at=7)
    (run,) = lineage_of_config(str(d / "s.yaml"))
    assert (run.last_step, run.planned) == (7, True)  # nothing saved yet: the plan, stopped at stop_at
    out = json.loads(cli("lineage", str(d / "s.yaml"), "--json"))
    assert out["stages"][0]["planned"] is True and out["stages"][0]["last_step"] == 7
    assert "steps 1..7 planned" in cli("lineage", str(d / "s.yaml"))
    fake_checkpoint(cfg, 5)  # the run has trained 5 steps so far
    (run,) = lineage_of_config(str(d / "s.yaml"))
    assert (run.last_step, run.planned, run.tokens_trained) == (5, False, 5 * GBS * SEQ)
    assert "planned" not in cli("lineage", str(d / "s.yaml"))
    fake_checkpoint(cfg, 6)
    (run,) = lineage_of_config(str(d / "run-s" / "step5" / "config.yaml"))  # a checkpoint's config: its own step
    assert (run.last_step, run.planned) == (5, False)
    assert lineage_of_config(str(d / "s.yaml"))[0].last_step == 6
