"""`olmo-data build-order`: write the data order(s) a training config will use, before training."""

from __future__ import annotations

import click

from olmo_cli.options import Command


@click.command("build-order", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--epochs", default=1, show_default=True, help="How many epochs' orders to build.")
@click.option("--first-epoch", default=0, show_default=True, help="The first epoch to build (0-based).")
@click.option(
    "--destination",
    default=None,
    help="Order directory or epoch-0 .npy file (default: data.order_path, else save_folder/train_data).",
)
def build_order(config: str, epochs: int, first_epoch: int, destination: str | None) -> None:
    """Build OLMo-compatible global_indices.npy orders for CONFIG's data, seed and global batch size.

    The order of epoch e is a PCG64(seed + e) shuffle of all instances, stored as headerless uint32, with a
    .json side file recording the data fingerprint; an existing order is kept if it matches the data.

    \b
    Examples:
      olmo-data build-order configs/tiny.yaml --epochs 2
    """
    from olmo_data.dataset import build_config_orders

    for summary in build_config_orders(config, epochs=epochs, first_epoch=first_epoch, location=destination):
        click.echo(summary.line())
