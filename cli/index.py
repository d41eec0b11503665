"""`olmo-data index`: suffix arrays over a run's token files, for `trace --text/--tokens/--spans`."""

from __future__ import annotations

import click

from olmo_cli.options import Command, progress_option


@click.command("index", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--index-dir", default=None, help="Put the index here [default: suffix-index/ beside the token files].")
@click.option("--shard-tokens", type=int, default=1 << 24, show_default=True, help="Positions per shard (memory).")
@click.option("--context", type=int, default=4096, show_default=True, help="Tokens a shard sorts by past its end.")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Shards sorted at once.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "numpy", "divsufsort"]),
    default="auto",
    show_default=True,
    help="Suffix sorting: numpy, or pydivsufsort (the `index` extra; auto uses it when installed).",
)
@progress_option
def index(
    config: str,
    index_dir: str | None,
    shard_tokens: int,
    context: int,
    processes: int,
    engine: str,
    progress: bool | None,
) -> None:
    """Build a suffix-array index over the token files of CONFIG's run: positions into the existing files (4 bytes
    a token), sharded, built in parallel and resumable (a rerun skips done shards, and rebuilds those of a token
    file that changed). `olmo-data trace --text/--tokens/--spans` then use it.

    \b
    Examples:
      olmo-data index runs/tiny/config.yaml --processes 2
      olmo-data index configs/olmo2-1b.yaml --index-dir /scratch/index --shard-tokens 100000000
    """
    from olmo_data.suffix_index import build_index
    from olmo_data.trace import open_run

    _, source = open_run(config)
    summary = build_index(
        source,
        index_dir=index_dir,
        shard_tokens=shard_tokens,
        context=context,
        processes=processes,
        engine=engine,
        progress=progress,
    )
    for message in summary.messages:
        click.echo(message, err=True)
    rate = summary.built_tokens / max(summary.seconds, 1e-9)
    click.echo(
        f"indexed {summary.files} token file(s), {summary.tokens:,} tokens in {summary.shards} shard(s): sorted "
        f"{summary.built} ({summary.built_tokens:,} tokens) in {summary.seconds:.1f} s ({rate / 1e6:.2f}M tokens/s, "
        f"{summary.engine}), {summary.shards - summary.built} already done; {summary.bytes_per_token:.2f} bytes a token"
    )
