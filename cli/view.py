"""`olmo-data view`: a local, read-only web view of a run (curves, spikes, batches, spans, stages)."""

from __future__ import annotations

import click

from olmo_cli.options import Command


@click.command("view", cls=Command)
@click.argument("run", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on (another only if asked).")
@click.option("--port", type=int, default=0, show_default=True, help="Port to serve on (0: a free one).")
@click.option("--no-open", is_flag=True, help="Do not open a browser; print the address only.")
@click.option("--window", default=20, show_default=True, help="Steps before each step that make its baseline.")
@click.option("--z", "z", default=3.0, show_default=True, help="Standard deviations above the baseline for a spike.")
@click.option(
    "--plot", default=None, metavar="FILE.png", help="Draw the run's curves to FILE (png, pdf, svg); no server."
)
@click.option("--log", is_flag=True, help="Log each request to the terminal.")
def view(run: str, host: str, port: int, no_open: bool, window: int, z: float, plot: str | None, log: bool) -> None:
    """Serve a read-only web view of RUN (a save folder, or its training config) on this machine: the loss,
    z-loss, per-source loss and learning rate over steps with the spikes marked; any step's batch (instances,
    documents, per-instance loss, decoded text, the fingerprint checked); the spans of a pasted text found in the
    training data and the steps that trained on them; the run's stages and data. Ctrl-C stops it.

    With --plot, draws the curves to a file instead (matplotlib: the `view` extra).

    \b
    Examples:
      olmo-data view demo_output/run
      olmo-data view runs/tiny/config.yaml --port 8765 --no-open
      olmo-data view runs/tiny --plot losses.png
    """
    from olmo_data.errors import DataError
    from olmo_data.interrupts import Interrupted
    from olmo_view import RunAnswers, ViewServer
    from olmo_view.server import is_loopback

    answers = RunAnswers(run, window=window, z=z)
    if plot is not None:
        from olmo_view.plot import plot_run

        click.echo(f"wrote {plot_run(answers, plot)}")
        return
    try:
        server = ViewServer(answers, host, port, log=log)
    except OSError as e:
        raise DataError(f"--host {host} --port {port}: cannot serve there ({e.strerror or e})") from None
    answers.warm()
    if is_loopback(host):
        click.echo(f"serving {run} at {server.url} (this machine only; Ctrl-C stops)")
    else:
        click.secho(
            f"serving {run} at {server.url}: bound to {host} as asked, so anyone who can reach this machine can read "
            "the run's data (Ctrl-C stops)",
            fg="yellow",
        )
    if not no_open:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except Interrupted:
        click.echo("stopped")
    finally:
        server.server_close()
