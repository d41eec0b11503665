"""`olmo-data build-order`: write the data order(s) a training config will use, before training."""

from __future__ import annotations

import click

from olmo_cli.options import Command


@click.command("build-order", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--epochs", default=1, show_default=True, help="How many epochs' orders to build.")
@click.option(
    "--first-epoch", type=int, default=None, help="The first epoch to build (0-based; an OLMo-core run's from 1) [0]."
)
@click.option(
    "--destination",
    default=None,
    help="Order directory or epoch-0 .npy file (default: data.order_path, else save_folder/train_data).",
)
def build_order(config: str, epochs: int, first_epoch: int | None, destination: str | None) -> None:
    """Build OLMo-compatible global_indices.npy orders for CONFIG's data, seed and global batch size.

    The order of epoch e is a PCG64(seed + e) shuffle of all instances, stored as headerless uint32, with a
    .json side file recording the data fingerprint; an existing order is kept if it matches the data.

    For the config.json an OLMo-core run saved (or a config of ours with data.olmo_core), it writes OLMo-core's
    order files instead (epochs from 1, PCG64(seed + epoch), chunked with max_target_sequence_length) under the
    names OLMo-core gives them, into its data_loader.work_dir (or --destination, a directory): byte for byte the
    files OLMo-core's loader writes and reads.

    \b
    Examples:
      olmo-data build-order configs/tiny.yaml --epochs 2
    """
    from olmo_data.run import read_run

    run = read_run(config)
    for line in run.build_orders(epochs=epochs, first_epoch=first_epoch, destination=destination):
        click.echo(line)
