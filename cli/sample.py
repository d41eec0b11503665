"""`olmo-data sample`."""

from __future__ import annotations

import click

from olmo_cli.options import Command, document_options, progress_option
from olmo_data.sample import sample as run_sample


@click.command(cls=Command)
@document_options
@click.option("--destination", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--fraction", type=float, help="Keep each document with this probability (hash of seed and id).")
@click.option("--every", type=int, help="Keep lines 1, K+1, 2K+1, ... of each file.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --fraction hash.")
@progress_option
def sample(
    documents: tuple[str, ...],
    text_field: str,
    id_field: str,
    skip_bad_documents: bool,
    destination: str,
    fraction: float | None,
    every: int | None,
    seed: int,
    progress: bool | None,
) -> None:
    """Sample documents deterministically into dolma-format shards (one per input file, same names).

    With --fraction the same documents are kept whatever the machine, file order or process count.

    \b
    Examples:
      olmo-data sample --documents runs/demo/documents/*.jsonl.gz --destination runs/sample --fraction 0.1
      olmo-data sample --documents docs/a.jsonl.gz docs/b.jsonl.gz --destination sampled --every 10
    """
    summary = run_sample(
        documents,
        destination,
        fraction=fraction,
        every=every,
        seed=seed,
        text_field=text_field,
        id_field=id_field,
        skip_bad_documents=skip_bad_documents,
        progress=progress,
    )
    click.echo(summary.line())
