"""`olmo-data mix`: combine tokenized sources by share or token budget into a mix manifest."""

from __future__ import annotations

import click

from olmo_cli.options import Command


@click.command("mix", cls=Command)
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--destination", required=True, help="Directory for mix.json and the selected instance ids.")
def mix(spec: str, destination: str) -> None:
    """Select instances from each source of SPEC (YAML) and write DESTINATION/mix.json.

    Point a training config's data.mix at DESTINATION. Prints the requested vs realized shares.

    The SPEC format (seed, sequence_length, total_tokens, dtype, sources with name, paths and share or
    tokens) is documented in docs/data.md (its section on mix) and in the example
    configs/mix_example.yaml.

    \b
    Examples:
      olmo-data mix configs/mix_example.yaml --destination runs/mix
    """
    from olmo_data.dataset import build_mix, mix_report

    manifest = build_mix(spec, destination)
    click.echo(mix_report(manifest))
    click.echo(f"wrote {destination.rstrip('/')}/mix.json")
