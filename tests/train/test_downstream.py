"""OLMo's downstream evaluations (ai2-olmo-eval): the values the loop logs and `olmo-train eval` prints are the ones
`olmo_eval`'s `ICLMetric` gives for the `transformers` logits of the exported model; any process count gives the
same; the 27 labels of OLMo2-7B-stage1.yaml are accepted and an unknown label is refused before step 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from olmo_data.config import ConfigError, ModelConfig, load_config
from olmo_data.errors import DataError
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer
from olmo_train.nn import Transformer
from olmo_train.train import downstream
from olmo_train.train.loop import main

olmo_eval = pytest.importorskip("olmo_eval")

REPO = Path(__file__).resolve().parents[2]
# a task of each metric type: accuracy, length-normalised accuracy, cross-entropy, bits per byte
TASKS = {"copa": "acc", "arc_challenge": "len_norm", "arc_easy_ppl": "ce_loss", "csqa_val_bpb_5shot": "bpb"}
BATCH, MAX_BATCHES = 4, 3
# the 27 downstream evaluators of allenai/OLMo configs/official-1124/OLMo2-7B-stage1.yaml, in its order
OLMO2_STAGE1_LABELS = (
    "piqa hellaswag winogrande openbook_qa boolq sciq arc_easy arc_challenge copa commonsense_qa social_iqa "
    "mmlu_stem_var mmlu_humanities_var mmlu_social_sciences_var mmlu_other_var mmlu_stem_mc_5shot "
    "mmlu_humanities_mc_5shot mmlu_social_sciences_mc_5shot mmlu_other_mc_5shot mmlu_stem_mc_5shot_test "
    "mmlu_humanities_mc_5shot_test mmlu_social_sciences_mc_5shot_test mmlu_other_mc_5shot_test basic_arithmetic "
    "trivia_qa_wiki_ppl natural_qs_open_ppl arc_easy_ppl"
).split()


def reference(label: str, tokenizer_path: str, logits_of: Any, max_requests: int) -> dict[str, float]:
    """olmo_eval's own path, one request at a time (no padding, no packing): its task, collate and metric fed
    by `logits_of(query ids)`; the first `max_requests` requests, to the end of the last question begun."""
    tok = load_tokenizer(tokenizer_path, "hf")
    eval_tok = olmo_eval.HFTokenizer(tokenizer_path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    task = olmo_eval.build_task(label, eval_tok, 512)
    last_doc = task[max_requests - 1]["doc_id"]
    metric = olmo_eval.ICLMetric(metric_type=task.metric_type)
    for i in range(len(task)):
        if task[i]["doc_id"] > last_doc:
            break
        metric.update(task.collate_fn([task[i]]), logits_of(torch.tensor([task[i]["query"]])))
    return {k: float(v) for k, v in metric.compute().items()}


def test_packed_batches_give_olmo_evals_values(demo_tokenizer: str) -> None:
    """Requests sorted by length, batched and padded, scored at the continuation positions only, give what
    olmo_eval gives one request at a time (the other metric types: the slow test below)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=2048, max_sequence_length=512))
    model.eval()
    tok = downstream.eval_tokenizer(load_tokenizer(demo_tokenizer, "hf"))
    labels = ["arc_challenge", "csqa_val_bpb_5shot"]
    tasks = downstream.build_tasks(labels, tok, 512, BATCH, 2)
    assert [t.dataset.metric_type for t in tasks] == [TASKS[label] for label in labels]
    got = downstream.evaluate_tasks(model, tasks, torch.device("cpu"), bf16=False)
    with torch.no_grad():
        for label in labels:
            expected = reference(label, demo_tokenizer, lambda ids: model(ids), BATCH * 2)
            assert set(got[label]) == set(expected)
            for key, value in expected.items():
                assert got[label][key] == pytest.approx(value, abs=2e-4), (label, key)
    record = downstream.record(got)
    assert (
        "eval/downstream/arc_challenge_len_norm_v1" in record and "eval/downstream/csqa_val_bpb_5shot_bpb_v2" in record
    )


def test_unknown_label_is_refused_before_step_1(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "t.npy"
    np.random.default_rng(0).integers(2, 250, 4096).astype(np.uint16).tofile(tokens)
    cfg = tiny_config(tmp_path / "run", str(tokens), labels=["copa", "hellaswg"], vocab=256)
    assert main([str(cfg)]) == 2
    err = capfd.readouterr().err
    line = "error: config key 'evaluators': unknown downstream task 'hellaswg'; did you mean 'hellaswag'"
    assert line in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    # token files without a manifest name no tokenizer: refused at start too, when the run will evaluate
    assert main([str(tiny_config(tmp_path / "run", str(tokens), labels=["copa"], vocab=256))]) == 2
    assert "error: downstream evaluators need the tokenizer: set tokenizer.identifier" in capfd.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_model_is_refused_before_step_1_and_in_eval(
    demo_tokenizer: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Token ids past the model's embedding rows would train step 1 and then die at the first evaluation with an
    IndexError; refused at start, in one line naming the tokenizer and model.vocab_size, as `olmo-train eval`."""
    from olmo_cli.train_main import main as olmo_train_cli

    tokens = tmp_path / "t.npy"
    np.random.default_rng(0).integers(2, 250, 4096).astype(np.uint16).tofile(tokens)
    size = load_tokenizer(demo_tokenizer, "hf").vocab_size
    assert size > 256
    cfg = tiny_config(tmp_path / "run", str(tokens), labels=["copa"], vocab=256)
    raw = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**raw, "tokenizer": {"identifier": demo_tokenizer}}))
    assert main([str(cfg)]) == 2
    err = capfd.readouterr().err
    line = f"error: tokenizer.identifier {demo_tokenizer!r}: the tokenizer has {size:,} tokens, more than the model's "
    assert line + "model.vocab_size 256;" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    plain = tiny_config(tmp_path / "plain", str(tokens), labels=[], vocab=256)
    assert main([str(plain)]) == 0
    args = ["eval", str(tmp_path / "plain" / "step2-unsharded"), "--tasks", "copa", "--tokenizer", demo_tokenizer]
    result = CliRunner().invoke(olmo_train_cli, args)
    assert result.exit_code == 2
    assert f"error: --tokenizer {demo_tokenizer}: the tokenizer has {size:,} tokens" in result.output


def test_a_continuation_longer_than_the_model_is_refused_by_name_in_the_loop_and_in_eval(
    demo_tokenizer: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """olmo_eval never cuts a continuation: on a 16-token model COPA's longest ones left no context token and the
    metric raised a shape ValueError after the forwards; now one line naming the task and the model's length."""
    from olmo_cli.train_main import main as olmo_train_cli

    tokens = tmp_path / "t.npy"
    np.random.default_rng(0).integers(2, 2000, 4096).astype(np.uint16).tofile(tokens)
    short = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 2048, "max_sequence_length": 16}
    for name, labels in (("copa", ["copa"]), ("plain", [])):
        cfg = tiny_config(tmp_path / name, str(tokens), labels=labels)
        raw = yaml.safe_load(cfg.read_text())
        cfg.write_text(yaml.safe_dump({**raw, "model": short, "tokenizer": {"identifier": demo_tokenizer}}))
    assert main([str(tmp_path / "copa.yaml")]) == 2
    err = capfd.readouterr().err
    line = "error: copa: a continuation of "
    assert line in err and "does not fit the model's context of 16 tokens (model.max_sequence_length)" in err
    assert "Traceback" not in err
    assert main([str(tmp_path / "plain.yaml")]) == 0
    args = ["eval", str(tmp_path / "plain" / "step2-unsharded"), "--tasks", "copa", "--tokenizer", demo_tokenizer]
    result = CliRunner().invoke(olmo_train_cli, args)
    assert result.exit_code == 2 and line in result.output and "Traceback" not in result.output


def test_winogrande_questions_that_olmo_eval_does_not_cut_are_refused_on_a_short_model(demo_tokenizer: str) -> None:
    """WinoGrande's queries are cut to the model but its recorded question lengths are not: scored on a 16-token
    model every value would be read at the wrong positions. Refused; on a 512-token model the same task builds."""
    tok = downstream.eval_tokenizer(load_tokenizer(demo_tokenizer, "hf"))
    with pytest.raises(DataError, match=r"^winogrande: a question and continuation of \d+ tokens do not fit the mo"):
        downstream.build_tasks(["winogrande"], tok, 16, BATCH, 2)
    (task,) = downstream.build_tasks(["winogrande"], tok, 512, BATCH, 2)
    assert task.requests >= BATCH


def test_the_27_labels_of_olmo2_stage1_are_accepted(tmp_path: Path) -> None:
    from tests.data.config.test_olmo_config import olmo_file, shaped

    evaluators = [{"label": label, "type": "downstream"} for label in OLMO2_STAGE1_LABELS]
    cfg = load_config(olmo_file(tmp_path, shaped(evaluators=evaluators)))
    assert [(e.label, e.type) for e in cfg.evaluators] == [(label, "downstream") for label in OLMO2_STAGE1_LABELS]
    assert cfg.tokenizer.identifier == "tokenizers/allenai_dolma2.json"
    downstream.check_labels([e.label for e in cfg.evaluators], "evaluators")  # every one known to olmo_eval
    with pytest.raises(DataError, match="unknown downstream task 'pika'"):
        downstream.check_labels(["pika"], "evaluators")


def test_tokenizer_identifier_forms(demo_tokenizer: str) -> None:
    """OLMo's `tokenizer.identifier`: a path, or a name relative to OLMo's repository that olmo_eval bundles."""
    bundled = downstream.load_identified("tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json")
    assert bundled.vocab_size > 50000 and bundled.eos_token_id is not None
    tok = downstream.eval_tokenizer(downstream.load_identified(demo_tokenizer), eos_token_id=7)
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (7, 1, None)  # the demo's <|padding|> is 1
    with pytest.raises(DataError, match="needs the tokenizer: set tokenizer.identifier"):
        downstream.eval_tokenizer(None)


def test_a_resumed_run_keeps_its_step_0_evaluation(tmp_path: Path) -> None:
    from olmo_train.train import MetricsLog

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "eval/downstream/piqa_acc_v1": 0.5}) + "\n" for s in (0, 1, 2)]
    path.write_text("".join(lines))
    log = MetricsLog(path, enabled=True)
    log.start(2)  # resuming from step 2: everything kept, nothing set aside
    log.close()
    assert path.read_text() == "".join(lines) and not list(tmp_path.glob("metrics.*.jsonl"))
    log.start(0)  # a fresh start: an earlier run's records, step 0 included, are set aside
    log.close()
    assert path.read_text() == "" and len(list(tmp_path.glob("metrics.*.jsonl"))) == 1


def test_eval_table() -> None:
    from olmo_train.train import EvalReport

    report = EvalReport({"piqa": {"len_norm_v1": 0.5, "bpb_v2": 1.23456}}, {"piqa": 8})
    lines = report.table().splitlines()
    assert lines[0].split() == ["task", "metric", "value", "questions"]
    assert lines[1].split() == ["piqa", "len_norm_v1", "0.5000", "8"] and lines[2].split()[2] == "1.2346"


def test_evaluator_forms(tmp_path: Path) -> None:
    def load(evaluators: list[dict[str, Any]], **top: Any) -> Any:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"evaluators": evaluators, **top}, sort_keys=False))
        return load_config(path, require_data=False)

    cfg = load([{"label": "ppl", "type": "lm", "data": {"datasets": {"c4": ["a.npy"], "books": ["b.npy", "c.npy"]}}}])
    assert [(e.label, e.type, e.paths) for e in cfg.evaluators] == [
        ("c4", "lm", ["a.npy"]),
        ("books", "lm", ["b.npy", "c.npy"]),
    ]
    cfg = load([{"label": "v", "paths": ["a.npy"]}, {"label": "piqa", "type": "downstream"}], eval_subset_num_batches=5)
    assert [(e.label, e.type) for e in cfg.evaluators] == [("v", "lm"), ("piqa", "downstream")]
    assert cfg.eval_subset_num_batches == 5
    with pytest.raises(ConfigError, match="'evaluators\\[0\\].type': got 'downstreem'.*did you mean 'downstream'"):
        load([{"label": "piqa", "type": "downstreem"}])
    with pytest.raises(ConfigError, match="'eval_subset_num_batches': -1 \\(every batch\\) or N >= 1, got 0"):
        load([{"label": "piqa", "type": "downstream"}], eval_subset_num_batches=0)
    with pytest.raises(ConfigError, match="downstream evaluator \\(piqa\\) reads no paths"):
        load([{"label": "piqa", "type": "downstream", "paths": ["a.npy"]}])


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = downstream.importlib.import_module

    def fake(name: str) -> Any:
        if name == "olmo_eval":
            raise ImportError("No module named 'olmo_eval'")
        return real(name)

    monkeypatch.setattr(downstream.importlib, "import_module", fake)
    with pytest.raises(DataError, match=r"needs ai2-olmo-eval.*pip install 'olmo-data\[eval\]'"):
        downstream.check_labels(["piqa"], "evaluators")


def tiny_config(run: Path, data: str, *, labels: list[str], vocab: int = 2048) -> Path:
    cfg = {
        "run_name": "downstream",
        "save_folder": str(run),
        "max_duration": 2,
        "global_train_batch_size": 2,
        "device_train_microbatch_size": 2,
        "device_eval_batch_size": BATCH,
        "distributed_strategy": "single",
        "save_interval": None,
        "save_interval_unsharded": 2,
        "eval_interval": 2,
        "eval_on_start": True,
        "eval_subset_num_batches": MAX_BATCHES,
        "evaluators": [{"label": label, "type": "downstream"} for label in labels],
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": vocab, "max_sequence_length": 512},
        "optimizer": {"learning_rate": 0.01},
        "scheduler": {"name": "constant"},
        "data": {"paths": [data]},
    }
    path = run.parent / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def logged(run: Path, step: int) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["step"] == step and any(k.startswith("eval/downstream/") for k in r))
    return {k: v for k, v in row.items() if k.startswith("eval/downstream/")}


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.slow
def test_loop_and_eval_command_log_olmo_evals_values_on_1_and_2_processes(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    """The loop's values at step 2 are olmo_eval's for the transformers logits of the exported step-2 model;
    `olmo-train eval` prints them; 2 processes (loop and command) give the 1-process values."""
    from olmo_cli.train_main import main as olmo_train_cli

    transformers = pytest.importorskip("transformers")
    tokenize(demo_corpus[:1], tmp_path / "tokens", TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    one = tmp_path / "one"
    assert main([str(tiny_config(one, str(tmp_path / "tokens"), labels=list(TASKS)))]) == 0
    at_start, at_2 = logged(one, 0), logged(one, 2)
    assert len(at_2) == len(at_start) == 10 + 10 + 2 + 2  # every metric ICLMetric returns, for each task

    def check_against_transformers(checkpoint: Path, logged_values: dict[str, float], hf_dir: Path) -> None:
        export = CliRunner().invoke(olmo_train_cli, ["export-hf", str(checkpoint), "--destination", str(hf_dir)])
        assert export.exit_code == 0, export.output
        hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
        with torch.no_grad():
            for label in TASKS:
                expected = reference(label, demo_tokenizer, lambda ids: hf(input_ids=ids).logits, BATCH * MAX_BATCHES)
                for key, value in expected.items():
                    assert logged_values[f"eval/downstream/{label}_{key}"] == pytest.approx(value, abs=2e-4), (
                        label,
                        key,
                    )

    check_against_transformers(one / "step2-unsharded", at_2, tmp_path / "hf")

    args = ["eval", str(one / "step2-unsharded"), "--tasks", ",".join(TASKS), "--batch-size", str(BATCH)]
    args += ["--max-batches", str(MAX_BATCHES), "--json"]
    result = CliRunner().invoke(olmo_train_cli, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)["results"]
    for label in TASKS:
        for key, value in printed[label].items():
            assert value == pytest.approx(at_2[f"eval/downstream/{label}_{key}"], abs=2e-4)

    args_hf = [str(tmp_path / "hf") if a == str(one / "step2-unsharded") else a for a in args]  # a transformers dir
    from_hf = json.loads(CliRunner().invoke(olmo_train_cli, args_hf).output)["results"]
    for label in TASKS:
        assert from_hf[label] == pytest.approx(printed[label], abs=2e-4)

    two = tmp_path / "two"
    config = tiny_config(two, str(tmp_path / "tokens"), labels=list(TASKS))
    torchrun("-m", "olmo_train", str(config), "--distributed_strategy=fsdp")  # ranks run equally many forwards
    assert logged(two, 0) == pytest.approx(at_start, abs=1e-5)  # the same initial weights, each request once
    check_against_transformers(two / "step2-unsharded", logged(two, 2), tmp_path / "hf-two")  # trained on 2 ranks
    proc = torchrun("-m", "olmo_cli.train_main", *args)
    printed_two = json.loads(proc.stdout)["results"]
    for label in TASKS:
        assert printed_two[label] == pytest.approx(printed[label], abs=1e-5)
