"""`olmo-data lineage`: the stages whose training shaped a run's weights, and the tokens each trained."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json


@click.command("lineage", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def lineage(config: str, as_json: bool) -> None:
    """The run of CONFIG and the runs it grew from: the checkpoint each stage started from (load_path, or the
    lineage its checkpoints record), through anneals, soups and imports; per stage the run, its config, the steps
    that shaped these weights (up to the checkpoint handed on) and their tokens (steps x batch tokens), and the
    total.

    \b
    Examples:
      olmo-data lineage configs/stage2.yaml
      olmo-data lineage runs/anneal-42/config.yaml --json
    """
    from olmo_data.run import format_lineage, lineage_of_config

    stages = lineage_of_config(config)
    if as_json:
        total = sum(s.tokens_trained or 0 for s in stages)
        echo_json({"stages": [s.to_json() for s in stages], "tokens_total": total})
    else:
        click.echo(format_lineage(stages))
