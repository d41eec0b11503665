"""`olmo-data stats`: tokens, documents and instances per source and file, document lengths, epochs."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json, progress_option
from olmo_data.errors import DataError


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
    from olmo_data.olmo_core import format_olmo_core_stats, olmo_core_of, olmo_core_stats

    core = olmo_core_of(paths[0]) if len(paths) == 1 and paths[0].endswith((".json", ".yaml", ".yml")) else None
    if core is not None:  # an OLMo-core run's config.json: its data as OLMo-core's loader reads it
        if mix or sequence_length or global_batch_size or duration or dtype:
            raise DataError(
                "an OLMo-core run's data (its config.json) gives the data, batch size and duration: no options"
            )
        found = olmo_core_stats(core)
        if as_json:
            echo_json(found.to_json())
        else:
            click.echo(format_olmo_core_stats(found, format_stats(found.stats)))
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
