"""`olmo-data demo-data`: make the built-in demo corpus and tokenizer (offline, from the standard library)."""

from __future__ import annotations

from pathlib import Path

import click

from olmo_cli.options import Command, progress_option
from olmo_data.demo import make_demo_data


@click.command("demo-data", cls=Command)
@click.option("--destination", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--shards", type=int, default=4, show_default=True, help="Number of .jsonl.gz shards.")
@click.option("--max-files", type=int, help="Use only the first N standard-library modules.")
@click.option("--vocab-size", type=int, default=8192, show_default=True, help="Vocabulary of the demo tokenizer.")
@progress_option
def demo_data(destination: str, shards: int, max_files: int | None, vocab_size: int, progress: bool | None) -> None:
    """Write a real-text corpus (the standard library's sources, dolma format) and a BPE tokenizer trained on it.

    Creates DESTINATION/documents/*.jsonl.gz, DESTINATION/tokenizer.json and DESTINATION/chat/tulu.jsonl (a
    user asks what each module is for, the assistant answers with its docstring: a sample for `prepare-tulu`);
    needs no network.

    \b
    Examples:
      olmo-data demo-data --destination runs/demo
    """
    dest = Path(destination)
    made = make_demo_data(dest, num_shards=shards, max_files=max_files, vocab_size=vocab_size, progress=progress)
    click.echo(
        f"wrote {len(made.documents)} document shards to {dest / 'documents'}, the tokenizer {made.tokenizer} "
        f"and {made.chat}"
    )
