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


class ManyValuesCommand(click.Command):
    """A command whose list options also take several values after one flag: `--documents a.gz b.gz c.gz`.

    `dolma tokens` users type lists that way (and shells expand globs into several words); click wants the flag
    repeated. Before parsing, each value that follows such a flag, up to the next option, gets the flag again.
    """

    many_values: tuple[str, ...] = ("--documents", "-d", "--input")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
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
        return super().parse_args(ctx, out)


backend_option = click.option(
    "--backend",
    type=click.Choice(["auto", "tiktoken", "hf"]),
    default="auto",
    show_default=True,
    help="Tokenizer backend; all give identical ids. auto: tiktoken where an exact equivalent passes the start-up "
    "self-check, else HF tokenizers.",
)
progress_option = click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
