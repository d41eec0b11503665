"""`olmo-data stats`: tokens, documents and instances per source and file, document lengths, epochs."""

from __future__ import annotations

import json

import click

from olmo_cli.options import Command


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
def stats(
    paths: tuple[str, ...],
    mix: str | None,
    sequence_length: int | None,
    global_batch_size: int | None,
    duration: str | None,
    dtype: str | None,
    no_lengths: bool,
    as_json: bool,
) -> None:
    """Statistics of token files/directories PATHS, a --mix, or a training CONFIG's data, as training will see it.

    A CONFIG (a .yaml file) gives the data, sequence length, batch size and duration; the options override them.

    \b
    Examples:
      olmo-data stats configs/tiny.yaml
      olmo-data stats runs/demo/tokens --sequence-length 128 --global-batch-size 16
    """
    from olmo_data.errors import DataError
    from olmo_data.instances import open_dataset, open_from_config
    from olmo_data.stats import dataset_stats, format_stats

    configs = [p for p in paths if p.endswith((".yaml", ".yml"))]
    if configs and len(paths) > 1:
        raise DataError(f"give one training CONFIG or token files/directories, not both: {' '.join(paths)}")
    config = configs[0] if configs else None
    if config is not None:
        from olmo_data.inspect import read_train_config

        cfg = read_train_config(config)
        if sequence_length is not None:
            cfg["model"]["max_sequence_length"] = sequence_length
        source = open_from_config(cfg)
        global_batch_size = global_batch_size or int(cfg["global_train_batch_size"])
        duration = duration or cfg.get("max_duration")
    else:
        if sequence_length is None and mix is not None and not paths:
            from olmo_data.mixture import read_mix_manifest

            sequence_length = int(read_mix_manifest(mix)[0]["sequence_length"])  # the mix was cut at it
        if sequence_length is None:
            raise DataError("--sequence-length is required without a CONFIG (instances are cut at that length)")
        if bool(paths) == bool(mix):
            raise DataError("give token files/directories as PATHS, or --mix DIR, or a training CONFIG")
        source = open_dataset(list(paths) or None, sequence_length=sequence_length, mix=mix, dtype=dtype)
    result = dataset_stats(
        source, global_batch_size=global_batch_size, duration=duration, document_lengths=not no_lengths
    )
    click.echo(json.dumps(result.to_json()) if as_json else format_stats(result))
