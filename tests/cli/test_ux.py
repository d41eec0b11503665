"""One voice and feedback (issue 36): progress bars that show on a terminal (forced on here) and stay quiet in a
pipe, `--help` by pipeline stage with whole lines, "did you mean" for a mistyped command, `--json` pretty on a
terminal and compact when piped, one span marking everywhere, third-party warnings hidden by `olmo_train.quiet`."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from olmo_cli.main import COMMANDS
from olmo_cli.main import main as data_main
from olmo_cli.options import STAGES, echo_json
from olmo_cli.train_main import TRAIN_COMMANDS
from olmo_cli.train_main import main as train_main
from olmo_data.display import ENV, bar_disabled, marked, progress_bar


def test_bars_follow_the_option_the_environment_and_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert bar_disabled(None) is None  # tqdm decides: on a terminal only
    assert bar_disabled(True) is False and bar_disabled(False) is True
    monkeypatch.setenv(ENV, "1")
    assert bar_disabled(None) is False and bar_disabled(False) is True
    monkeypatch.setenv(ENV, "0")
    assert bar_disabled(None) is True
    monkeypatch.setenv("RANK", "1")  # under torchrun only the first rank draws
    assert bar_disabled(True) is True


def test_a_bar_is_quiet_when_stderr_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with progress_bar(desc="quiet", total=3) as bar:
        bar.update(3)
    with progress_bar(desc="forced", total=3, progress=True, delay=60) as bar:  # asked for: no delay
        bar.update(3)
    err = capsys.readouterr().err
    assert "quiet" not in err and "forced" in err and "100%|" in err


def data_command(args: list[str], env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(data_main, args, env=env)
    assert result.exit_code == 0, result.output + result.stderr
    return result


def test_demo_data_sample_stats_and_prepare_tulu_show_bars_with_totals(tmp_path: Path) -> None:
    forced = {ENV: "1"}
    demo = data_command(["demo-data", "--destination", str(tmp_path / "demo"), "--max-files", "12"], forced)
    assert "demo-data" in demo.stderr and "36/36" in demo.stderr  # three passes over 12 modules
    quiet = data_command(["demo-data", "--destination", str(tmp_path / "quiet"), "--max-files", "12"], {ENV: ""})
    assert quiet.stderr == ""  # CliRunner's stderr is no terminal

    shards = sorted(str(p) for p in (tmp_path / "demo" / "documents").glob("*.jsonl.gz"))
    sampled = data_command(["sample", "-d", *shards, "--destination", str(tmp_path / "s"), "--every", "2"], forced)
    assert "sample" in sampled.stderr and "100%|" in sampled.stderr

    tok = str(tmp_path / "demo" / "tokenizer.json")
    data_command(["tokenize", "-d", *shards, "-t", tok, "--destination", str(tmp_path / "tokens")])
    stats = data_command(["stats", str(tmp_path / "tokens"), "--sequence-length", "64"], forced)
    assert "stats" in stats.stderr and "100%|" in stats.stderr

    chat = str(tmp_path / "demo" / "chat" / "tulu.jsonl")
    rows = sum(1 for line in Path(chat).read_text().splitlines() if line.strip())
    tulu = data_command(
        ["prepare-tulu", "-d", chat, "-t", tok, "--destination", str(tmp_path / "sft"), "--sequence-length", "64"],
        forced,
    )
    assert f"{rows}/{rows}" in tulu.stderr and "rows" in tulu.stderr  # a total, so a percentage and an ETA


def test_prepare_tulus_bar_counts_rows_without_blank_lines(tmp_path: Path) -> None:
    from olmo_data.chat.rows import count_rows

    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3}')  # no newline after the last row
    assert count_rows([str(path)]) == 3
    assert count_rows([str(path), "https://example.org/x.jsonl"]) is None  # not worth a download


def test_a_mistyped_command_gets_the_closest_names() -> None:
    result = CliRunner().invoke(data_main, ["tokenise"])
    assert result.exit_code == 2
    assert "no command 'tokenise'; did you mean 'tokenize'?" in result.output
    result = CliRunner().invoke(train_main, ["export-fh"])
    assert result.exit_code == 2 and "did you mean 'export-hf'" in result.output
    result = CliRunner().invoke(data_main, ["frobnicate"])
    assert result.exit_code == 2 and "did you mean" not in result.output and "--help` lists them" in result.output


@pytest.mark.parametrize(("group", "commands"), [(data_main, COMMANDS), (train_main, TRAIN_COMMANDS)])
def test_help_lists_every_command_once_by_stage_in_whole_lines(group: Any, commands: dict[str, str]) -> None:
    text = CliRunner().invoke(group, ["--help"], terminal_width=200).output
    sections = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    stages = [s for s in STAGES if s in sections]
    assert stages == [s for s in sections if s in STAGES] and stages, sections  # in pipeline order
    assert "Other" not in sections  # every command has its stage
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    for name in commands:
        assert name in lines, f"{name} not listed"
        described = next(d for s in STAGES.values() for n, d in s.items() if n == name)
        assert lines[name].rstrip().endswith(described), lines[name]  # whole: not cut at click's 45 characters
        assert not lines[name].rstrip().endswith("...")


def test_json_is_pretty_on_a_terminal_and_compact_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    value = {"a": [1, 2], "text": "é"}
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    echo_json(value)
    piped = capsys.readouterr().out
    assert piped.count("\n") == 1 and piped.endswith("}\n") and '"é"' in piped  # one line, UTF-8 as is
    assert json.loads(piped) == value and piped.replace(" ", "") == '{"a":[1,2],"text":"é"}\n'
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    echo_json(value)
    shown = capsys.readouterr().out
    assert shown.startswith('{\n  "a": [\n') and json.loads(shown) == json.loads(piped)


def test_every_json_command_prints_through_the_one_helper() -> None:
    """A command with --json prints it with echo_json (no json.dumps of its own, which would ignore the terminal)."""
    cli = Path(__file__).resolve().parents[2] / "cli"
    for path in cli.glob("*.py"):
        text = path.read_text()
        if '"--json"' in text:
            assert "echo_json(" in text and "json.dumps(" not in text, path.name


def test_one_span_marking_in_trace_generate_and_inspect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`trace --spans`, `generate --trace` (on a terminal too) and `inspect-batch --decode` mark with [[ ]]."""
    import olmo_train.generate as gen
    from olmo_data.trace.spans import SpansReport, format_spans

    segments = [("def ", False), ("main():", True), (" pass", False)]
    report = SpansReport([1, 2, 3], 2, [], None, {"index": False, "tokens": 10, "seconds": 0.1}, segments)  # type: ignore[arg-type]
    assert marked(segments) == "def [[main():]] pass"
    monkeypatch.setattr(gen, "complete_text", lambda *a, **k: gen.TextCompletions([[(0.0, "main(): pass")]], 1, 1, 0.1))
    monkeypatch.setattr(gen, "trace_continuation", lambda *a, **k: report)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    checkpoint = tmp_path / "step1"
    checkpoint.mkdir()
    result = CliRunner().invoke(train_main, ["generate", str(checkpoint), "--prompt", "x", "--trace"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("xdef [[main():]] pass\n") and "\x1b[" not in result.stdout
    assert "no span of 8 tokens or more" in result.stdout  # the report has no spans: said, not left blank
    assert "[[" not in format_spans(report)  # nothing found, nothing marked


def test_inspect_batch_shows_decoded_text_as_text_with_untrained_tokens_marked() -> None:
    import numpy as np

    from olmo_data.run.batches import BatchReport, InstanceReport, _runs, format_report

    class Decoder:
        def decode(self, ids: list[int]) -> str:
            return "".join(chr(ord("a") + i) for i in ids).replace("d", "\n")

    ids = np.array([0, 1, 2, 3, 4, 5])
    mask = np.array([False, False, True, True, True, False])
    runs = _runs(Decoder(), ids, mask)
    assert runs == [("ab", True), ("c\ne", False), ("f", True)]
    fields: dict[str, Any] = {f: 0 for f in BatchReport.__dataclass_fields__ if f not in ("instances",)}
    fields |= {"order_path": "o", "data_fingerprint": "d", "batch_fingerprint": "b", "rank": None}
    fields |= {"world_size": None, "assumed_dtype": None, "run_steps": None, "lineage_note": None}
    fields |= {"instance_filter": None}
    report = BatchReport(**{k: v for k, v in fields.items() if k in BatchReport.__dataclass_fields__})
    inst = InstanceReport(0, 0, "p.npy", 0, ids, mask, text="abc\nef", untrained_text=runs, documents=[])
    report.instances.append(inst)
    text = format_report(report)
    assert "    text ([[ ]]: not trained, the label mask's):\n      [[ab]]c\n      e[[f]]" in text
    assert '"' not in text.split("text (")[1]  # text, not a quoted one-liner


def test_quiet_hides_third_party_warnings_unless_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    from olmo_train import quiet

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet(verbose=True)  # --verbose: as the libraries print them
        warnings.warn("`torch.utils._pytree._register_pytree_node` is deprecated", FutureWarning, stacklevel=1)
        assert len(caught) == 1
        quiet()
        warnings.warn("`torch.utils._pytree._register_pytree_node` is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("Failed to load .../_C_mxfp8.so: Could not load this library", UserWarning, stacklevel=1)
        assert len(caught) == 1
        warnings.warn("ours", UserWarning, stacklevel=1)  # a warning of ours still shows
        assert len(caught) == 2
        # ai2-olmo-eval's metrics warn through torch on every evaluation: hidden, whatever the category
        warnings.warn_explicit(
            "To copy construct from a tensor ...", UserWarning, "metrics.py", 387, "olmo_eval.metrics"
        )
        assert len(caught) == 2
    assert not logging.getLogger("torchao").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("olmo_eval").isEnabledFor(logging.WARNING)
    for name in ("torchao", "olmo_eval", "datasets", "torch.utils._pytree", "torch.distributed.elastic"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_commands_log_plainly_and_name_loggers_only_with_verbose() -> None:
    """No `INFO module:` prefix by default (a fresh process: logging starts unconfigured, as for a user)."""
    import subprocess

    code = (
        "import logging, sys; from olmo_cli.options import setup_logging; setup_logging(sys.argv[1] == 'v'); "
        "logging.getLogger('olmo_data.x').info('built the order'); logging.getLogger('olmo_data.x').debug('detail')"
    )
    plain = subprocess.run([sys.executable, "-c", code, "-"], capture_output=True, text=True, timeout=120)
    verbose = subprocess.run([sys.executable, "-c", code, "v"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and verbose.returncode == 0, plain.stderr + verbose.stderr
    assert plain.stderr == "built the order\n"
    assert verbose.stderr == "INFO olmo_data.x: built the order\nDEBUG olmo_data.x: detail\n"


def test_make_install_takes_torch_alone_from_the_cpu_index_when_asked(tmp_path: Path) -> None:
    """`make install TORCH_INDEX=URL` gives the URL to the torch install only; without it, pip's own index."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    venv = f"VENV={tmp_path / 'venv'}"  # a dry run (-n): nothing is installed, nothing downloaded
    cpu = "https://download.pytorch.org/whl/cpu"
    planned = subprocess.run(
        ["make", "-n", "install", venv, f"TORCH_INDEX={cpu}"], cwd=repo, capture_output=True, text=True
    )
    default = subprocess.run(["make", "-n", "install", venv], cwd=repo, capture_output=True, text=True)
    assert planned.returncode == 0 and default.returncode == 0, planned.stderr + default.stderr
    with_index = [line for line in planned.stdout.splitlines() if "--index-url" in line]
    assert len(with_index) == 1 and '"torch==2.13.0"' in with_index[0] and f'--index-url "{cpu}"' in with_index[0]
    assert "--index-url" not in default.stdout and '"torch==2.13.0"' in default.stdout
