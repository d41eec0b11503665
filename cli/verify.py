"""`olmo-train verify`: is a checkpoint intact and safe to load? Checked without loading a model."""

from __future__ import annotations

import sys

import click

from olmo_cli.options import Command


@click.command("verify", cls=Command)
@click.argument("checkpoint")
@click.option(
    "--strict",
    is_flag=True,
    help="Fail on a checkpoint without checksums.json (saved before checksums existed) instead of warning.",
)
@click.option(
    "--lineage",
    "show_lineage",
    is_flag=True,
    help="Also print where the weights came from: each parent stage (load_path, import, soup) with its step and "
    "tokens, and the tokens of all stages in total.",
)
def verify(checkpoint: str, strict: bool, show_lineage: bool) -> None:
    """Check CHECKPOINT (a stepN/ or stepN-unsharded/ directory, or its URL, fetched as a load would) without
    loading a model: every file's size and SHA-256 against its checksums.json, the sharded metadata read without
    running code, its shard names inside the directory, every tensor it lists inside an existing shard file, and
    every torch.save file loadable as plain data. Prints one line: OK or FAILED, naming the file at fault. Exit
    status 0 when intact, 2 when not. A checkpoint without checksums.json passes with a warning (its bytes cannot
    be checked) unless --strict.

    \b
    Examples:
      olmo-train verify runs/tiny/step100
      olmo-train verify --strict https://example.org/runs/tiny/step100
      olmo-train verify --lineage runs/soup
    """
    from olmo_data.errors import DataError
    from olmo_train.checkpoint import lineage_lines, verify_checkpoint

    try:
        click.echo(f"OK {verify_checkpoint(checkpoint, strict=strict)}")
        for line in lineage_lines(checkpoint) if show_lineage else []:
            click.echo(line)
    except DataError as e:
        click.echo(f"FAILED {e}")
        sys.exit(2)
