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
                ".parquet. Repeat for more.",
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
