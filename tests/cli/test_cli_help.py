"""Every command of `olmo-data` and `olmo-train` ends its `--help` with examples, and every example parses: the
command exists and takes the options the example gives (a renamed option cannot leave a stale example behind)."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from olmo_cli.main import COMMANDS
from olmo_cli.main import main as data_main
from olmo_cli.train_main import TRAIN_COMMANDS
from olmo_cli.train_main import main as train_main

GROUPS = {"olmo-data": (data_main, COMMANDS), "olmo-train": (train_main, TRAIN_COMMANDS)}


def examples(help_text: str) -> list[str]:
    """The example command lines after "Examples:", with backslash continuations joined."""
    lines = help_text.split("Examples:", 1)[1].split("Options:", 1)[0].splitlines()
    out: list[str] = []
    pending = ""
    for line in lines:
        text = line.strip()
        if pending:
            text, pending = pending + " " + text, ""
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        if text.startswith(tuple(GROUPS)):
            out.append(text.split("  #", 1)[0].strip())
    return out


@pytest.mark.parametrize(("program", "name"), [(p, n) for p, (_, commands) in GROUPS.items() for n in sorted(commands)])
def test_help_ends_with_examples_that_parse(program: str, name: str) -> None:
    group, _ = GROUPS[program]
    result = CliRunner().invoke(group, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output, f"{program} {name} --help has no examples"
    found = examples(result.output)
    assert found, f"{program} {name}: no example command line after 'Examples:'"
    for line in found:
        words = shlex.split(line)
        owner = GROUPS[words[0]][0]  # an example may show the other program's command too
        sub = owner.get_command(click.Context(owner), words[1])
        assert sub is not None, f"{line}: no command {words[1]!r}"
        sub.make_context(words[1], words[2:])  # raises on an unknown option or a missing required one


def all_commands() -> list[tuple[str, str, click.Command]]:
    out = []
    for program, (group, commands) in GROUPS.items():
        for name in sorted(commands):
            command = group.get_command(click.Context(group), name)
            assert command is not None
            out.append((program, name, command))
    return out


def test_every_command_speaks_one_language() -> None:
    """One class parses every command (aliases, --config, lists); a long option has the same short form wherever
    it appears; no visible option keeps an old spelling."""
    from olmo_cli.options import ALIASES, Command

    shorts: dict[str, dict[str, set[str]]] = {}
    for program, name, command in all_commands():
        assert isinstance(command, Command), f"{program} {name} is not a cli.options.Command"
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            assert not set(param.opts) & set(ALIASES), f"{program} {name} shows old spelling {param.opts}"
            for long in (o for o in param.opts if o.startswith("--")):
                short = {o for o in param.opts + param.secondary_opts if not o.startswith("--")}
                shorts.setdefault(long, {})[f"{program} {name}"] = short
    for long, by_command in shorts.items():
        assert len({frozenset(s) for s in by_command.values()}) == 1, f"{long} has different short forms: {by_command}"
    for long, short in {"--documents": {"-d"}, "--tokenizer": {"-t"}, "--processes": {"-p"}}.items():
        assert all(s == short for s in shorts[long].values()), (long, shorts[long])


def parsed(program: str, args: list[str]) -> dict[str, object]:
    group = GROUPS[program][0]
    command = group.get_command(click.Context(group), args[0])
    assert command is not None
    return dict(command.make_context(args[0], args[1:]).params)


def test_old_spellings_still_parse_to_the_new_ones(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--tokenizer", "tok.json", "--destination", "out"]
    new = parsed("olmo-data", ["prepare-tulu", "-d", "a.jsonl", "b.jsonl", *common, "--sequence-length", "64"])
    old = parsed(
        "olmo-data", ["prepare-tulu", "--input", "a.jsonl", "b.jsonl", *common, "--seq-len=64", "--skip-bad-rows"]
    )
    assert new["inputs"] == old["inputs"] == ("a.jsonl", "b.jsonl")
    assert new["sequence_length"] == old["sequence_length"] == 64
    assert old["skip_bad_documents"] is True and new["skip_bad_documents"] is False
    err = capsys.readouterr().err
    assert "--seq-len is now --sequence-length" in err and "--input is now --documents" in err
    # a CONFIG is positional everywhere; `--config X` still means X
    assert parsed("olmo-data", ["stats", "--config", "c.yaml"])["paths"] == ("c.yaml",)
    assert parsed("olmo-data", ["inspect-batch", "--config=c.yaml", "--step", "3"])["config"] == "c.yaml"
    assert parsed("olmo-data", ["build-order", "--config", "c.yaml"])["config"] == "c.yaml"
    # an alias is only rewritten where the command has the new name: elsewhere click names the unknown option
    with pytest.raises(click.NoSuchOption, match="--seq-len"):
        parsed("olmo-data", ["sample", "-d", "a.jsonl", "--destination", "o", "--seq-len", "3"])
