"""`olmo-data index`: suffix arrays over a run's token files, for `trace --text/--tokens/--spans`."""

from __future__ import annotations

import os
from typing import Any

import click

from olmo_cli.options import Command, progress_option
from olmo_cli.tokenize import ShardType


@click.command("index", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--index-dir", default=None, help="Put the index here [default: suffix-index/ beside the token files].")
@click.option(
    "--shard-tokens",
    type=int,
    default=1 << 26,
    show_default=True,
    help="Positions per shard: each sort holds ~26 bytes a position with divsufsort (~1.7 GB), ~80 with numpy "
    "(~5.3 GB); fewer shards answer faster.",
)
@click.option("--context", type=int, default=4096, show_default=True, help="Tokens a shard sorts by past its end.")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Shards sorted at once.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "numpy", "divsufsort"]),
    default="auto",
    show_default=True,
    help="Suffix sorting: numpy, or pydivsufsort (the `index` extra; auto uses it when installed).",
)
@click.option(
    "--shard",
    type=ShardType(),
    default=None,
    help="Sort only machine I's share of N (any order, same result as one machine). In a Slurm array task: "
    "SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT. The machine that finds every shard done writes the manifest.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Build nothing: check the index whole against what its build recorded (every token, positions and keys "
    "file hashed, every suffix's range and order, every key: ~1 s a million tokens, one process) and say what was "
    "checked. Each query checks samples only (~2 ms a shard).",
)
@progress_option
def index(
    config: str,
    index_dir: str | None,
    shard_tokens: int,
    context: int,
    processes: int,
    engine: str,
    shard: Any,
    verify: bool,
    progress: bool | None,
) -> None:
    """Build a suffix-array index over the token files of CONFIG's run: positions into the existing files (4 bytes
    a token, and 1/8 byte of sampled keys: 1/4 for uint32 tokens), sharded, built in parallel and resumable (a
    rerun skips done shards, and rebuilds those of a token file that changed). `olmo-data trace` then uses it for
    --text, --tokens and --spans.

    \b
    Examples:
      olmo-data index runs/tiny/config.yaml --processes 2
      olmo-data index configs/olmo2-1b.yaml --index-dir /scratch/index --shard-tokens 100000000
      olmo-data index configs/olmo2-1b.yaml --shard 0/3     # on machine 0 of 3 (and 1/3, 2/3 on the others)
      olmo-data index runs/tiny/config.yaml --verify       # the full check; each query checks samples only
    """
    from olmo_data.suffix_index import build_index
    from olmo_data.tokenize import Shard
    from olmo_data.trace import open_run

    if shard is None and (shard := Shard.from_slurm_array(os.environ)) is not None:
        click.echo(f"shard {shard} (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)", err=True)

    _, source = open_run(config)
    if verify:
        from olmo_data.suffix_index import verify_index

        checked = verify_index(source, index_dir=index_dir, progress=progress)
        click.echo(
            f"verified the suffix index of {checked.files} token file(s), {checked.tokens:,} tokens in "
            f"{checked.shards} shard(s) in {checked.seconds:.1f} s: every token against its shard's window checksum "
            f"({checked.token_bytes / 1e6:,.1f} MB), every positions and keys file against its block checksums "
            f"({checked.index_bytes / 1e6:,.1f} MB), every suffix inside its shard and in sorted order, every key"
        )
        return
    summary = build_index(
        source,
        index_dir=index_dir,
        shard_tokens=shard_tokens,
        context=context,
        processes=processes,
        engine=engine,
        progress=progress,
        part=None if shard is None else (shard.index, shard.count),
    )
    for message in summary.messages:
        click.echo(message, err=True)
    if summary.engine == "numpy" and engine == "auto" and summary.built:
        click.echo(
            "note: sorted with numpy; `pip install 'olmo-data[index]'` sorts with divsufsort, about 3x faster in a "
            "third of the memory",
            err=True,
        )
    rate = summary.built_tokens / max(summary.seconds, 1e-9)
    click.echo(
        f"indexed {summary.files} token file(s), {summary.tokens:,} tokens in {summary.shards} shard(s): sorted "
        f"{summary.built} ({summary.built_tokens:,} tokens) in {summary.seconds:.1f} s ({rate / 1e6:.2f}M tokens/s, "
        f"{summary.engine}), {summary.shards - summary.built} already done; {summary.bytes_per_token:.2f} bytes a token"
        + (f"; shard {shard}: {summary.pending} shard(s) of other machines still to do" if summary.pending else "")
    )
