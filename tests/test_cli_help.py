"""Every command of `olmo-data` and `olmo-train` ends its `--help` with examples, and every example parses: the
command exists and takes the options the example gives (a renamed option cannot leave a stale example behind)."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from cli.main import COMMANDS
from cli.main import main as data_main
from cli.train_main import TRAIN_COMMANDS
from cli.train_main import main as train_main

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
