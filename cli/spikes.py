"""`olmo-data spikes`: the steps where a run's loss jumped, and the instances and documents behind each jump."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json


@click.command("spikes", cls=Command)
@click.argument("run", type=click.Path())
@click.option("--window", default=20, show_default=True, help="Steps before each step that make its baseline.")
@click.option("--z", "z", default=3.0, show_default=True, help="Standard deviations above the baseline to count.")
@click.option("--top", default=5, show_default=True, help="Instances shown per spike (most added to the jump).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--plot", default=None, metavar="FILE.png", help="Also draw the loss with its spikes to FILE (matplotlib)."
)
def spikes(run: str, window: int, z: float, top: int, as_json: bool, plot: str | None) -> None:
    """List the steps of RUN (a save folder, or its training config) whose train/loss jumps above the rolling
    baseline, each with the instances that added most to the jump, their sources and documents.

    The instances come from the run's per-instance loss record (instance_loss.bin in the save folder).

    \b
    Examples:
      olmo-data spikes runs/tiny
      olmo-data spikes runs/tiny/config.yaml --window 50 --z 4 --json
      olmo-data spikes runs/tiny --plot spikes.png
    """
    from olmo_data.run import find_spikes, format_spikes

    report = find_spikes(run, window=window, z=z, top=top)
    if plot is not None:
        from olmo_view import RunAnswers
        from olmo_view.plot import plot_spikes

        plot_spikes(RunAnswers(run, window=window, z=z), plot, report)
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(format_spikes(report))
