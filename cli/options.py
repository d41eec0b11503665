"""Options shared by several commands, defined once so their names and help stay the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def document_options(f: F) -> F:
    """--documents, --text-field, --id-field, --skip-bad-documents."""
    for option in reversed(
        [
            click.option(
                "--documents",
                "-d",
                multiple=True,
                required=True,
                metavar="PATTERN",
                help="Input files: paths, globs, s3://, gs:// or http(s):// URLs; .json/.jsonl(.gz|.zst) or "
                ".parquet. Several may follow one flag.",
            ),
            click.option("--text-field", default="text", show_default=True, help="Field holding the text."),
            click.option("--id-field", default="id", show_default=True, help="Field holding the document id."),
            click.option(
                "--skip-bad-documents",
                is_flag=True,
                help="Count and skip malformed lines, missing/non-string text and invalid UTF-8 instead of failing.",
            ),
        ]
    ):
        f = option(f)
    return f


# Old spellings, accepted for one release with a note: the same concept has one name in every command.
ALIASES: dict[str, str] = {
    "--input": "--documents",  # prepare-tulu's input files, as tokenize and sample name theirs
    "--seq-len": "--sequence-length",  # prepare-tulu, as stats and the configs (max_sequence_length) say
    "--skip-bad-rows": "--skip-bad-documents",  # prepare-tulu, as tokenize and sample
}
# A CONFIG is a positional argument everywhere (`torchrun -m olmo_train CONFIG` too): `--config X` means X.
POSITIONAL_FLAGS = ("--config",)


class Command(click.Command):
    """Every `olmo-data` and `olmo-train` command: one CLI language, with old spellings still understood.

    Before parsing, (1) an old option name (ALIASES) becomes its new one, with a note on stderr, where the command
    has the new one; (2) `--config X` becomes the positional X where the command takes its CONFIG positionally;
    (3) list options also take several values after one flag (`--documents a.gz b.gz c.gz`), the way `dolma
    tokens` users type lists and shells expand globs; click wants the flag repeated, so each such value gets it.
    """

    many_values: tuple[str, ...] = ("--documents", "-d")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._repeat_list_flags(self._rename(args)))

    def _option_names(self) -> set[str]:
        return {name for p in self.params if isinstance(p, click.Option) for name in p.opts}

    def _rename(self, args: list[str]) -> list[str]:
        names = self._option_names()
        positional = any(isinstance(p, click.Argument) for p in self.params)
        out: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":  # everything after it is a value
                out.extend(args[i:])
                break
            flag, eq, value = arg.partition("=")
            new = ALIASES.get(flag)
            if new is not None and new in names:
                click.echo(f"note: {flag} is now {new}; the old name goes away in the next release", err=True)
                out.append(new + eq + value)
            elif flag in POSITIONAL_FLAGS and flag not in names and positional:
                if eq:
                    out.append(value)
            else:
                out.append(arg)
        return out

    def _repeat_list_flags(self, args: list[str]) -> list[str]:
        out: list[str] = []
        flag: str | None = None
        for arg in args:
            if arg in self.many_values:
                flag = arg
                out.append(arg)
                continue
            if arg.startswith("-") and arg != "-":
                flag = None
            elif flag is not None and out and out[-1] != flag:
                out.append(flag)
            out.append(arg)
        return out


backend_option = click.option(
    "--backend",
    type=click.Choice(["auto", "tiktoken", "hf"]),
    default="auto",
    show_default=True,
    help="Tokenizer backend; all give identical ids. auto: tiktoken where an exact equivalent passes the start-up "
    "self-check, else HF tokenizers.",
)
progress_option = click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
