"""`olmo-data stats`: tokens, documents and instances per source and file, document lengths, epochs."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json, progress_option


@click.command("stats", cls=Command)
@click.argument("paths", nargs=-1)
@click.option("--mix", default=None, help="A mix directory (or mix.json) instead of PATHS.")
@click.option(
    "--sequence-length", type=int, default=None, help="Instance length (default: the CONFIG's, or the --mix's)."
)
@click.option("--global-batch-size", type=int, default=None, help="Instances per step, to count epochs.")
@click.option("--duration", default=None, help="Run length: steps (1000), tokens (2e9T) or epochs (2ep).")
@click.option("--dtype", default=None, help="Token dtype for files without a manifest.")
@click.option("--no-lengths", is_flag=True, help="Skip document lengths (they need the metadata index).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@progress_option
def stats(
    paths: tuple[str, ...],
    mix: str | None,
    sequence_length: int | None,
    global_batch_size: int | None,
    duration: str | None,
    dtype: str | None,
    no_lengths: bool,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Statistics of token files/directories PATHS, a --mix, or a training CONFIG's data, as training will see it.

    A CONFIG (a .yaml file) gives the data, sequence length, batch size and duration; the options override them.
    The config.json an OLMo-core run saved gives its data as OLMo-core reads it (batch size in tokens, epochs from 1).

    \b
    Examples:
      olmo-data stats configs/tiny.yaml
      olmo-data stats runs/demo/tokens --sequence-length 128 --global-batch-size 16
    """
    from olmo_data.dataset import format_stats, stats_for
    from olmo_data.run import read_run

    if len(paths) == 1 and paths[0].endswith((".json", ".yaml", ".yml")):  # a run's config: its trainer's reading
        run = read_run(paths[0])
        options = dict(sequence_length=sequence_length, global_batch_size=global_batch_size, duration=duration)
        found = run.stats(document_lengths=not no_lengths, progress=progress, mix=mix, dtype=dtype, **options)
        if as_json:
            echo_json(found.to_json())
        else:
            click.echo(run.format_stats(found))
        return
    result = stats_for(
        paths,
        mix=mix,
        sequence_length=sequence_length,
        global_batch_size=global_batch_size,
        duration=duration,
        dtype=dtype,
        document_lengths=not no_lengths,
        progress=progress,
    )
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(format_stats(result))
