"""`olmo-data inspect-batch`: the tokens and documents of any training batch, from the training config."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json


@click.command("inspect-batch", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--step", type=int, default=None, help="Training step (1-based; step N trains batch N-1).")
@click.option("--batch-index", type=int, default=None, help="Global batch index (0-based), instead of --step.")
@click.option("--rank", type=int, default=None, help="Show only the part rank R consumed (needs --world-size).")
@click.option("--world-size", type=int, default=None, help="Number of ranks the run used.")
@click.option("--order", default=None, help="Order directory, file or URL (default: from the config).")
@click.option("--decode", is_flag=True, help="Decode each instance to text.")
@click.option(
    "--tokenizer",
    "-t",
    default=None,
    help="Tokenizer for --decode (default: the one the manifest records); its sha256 must match the manifest's.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--no-verify-data",
    is_flag=True,
    help="Use the order even if it was built for data at other paths (check the batch fingerprint then).",
)
@click.option(
    "--sort",
    type=click.Choice(["position", "loss"]),
    default="position",
    show_default=True,
    help="Order of the instances: the batch's, or by the run's loss on each at the step (highest first).",
)
@click.option(
    "--save-folder",
    default=None,
    help="Where the run's per-instance losses are (default: the config's save_folder).",
)
@click.option("--max-tokens", default=16, show_default=True, help="Token ids shown per instance (text output).")
def inspect_batch(
    config: str,
    step: int | None,
    batch_index: int | None,
    rank: int | None,
    world_size: int | None,
    order: str | None,
    decode: bool,
    tokenizer: str | None,
    as_json: bool,
    max_tokens: int,
    no_verify_data: bool,
    sort: str,
    save_folder: str | None,
) -> None:
    """Show which instances, tokens and documents a training step of CONFIG's run trained on.

    Prints the batch fingerprint, to compare with train/batch_fingerprint in the run's metrics, and, once the run
    trained the step, the loss it had on each instance (in --json: `loss`, per supervised token, and
    `supervised_tokens`; an infinite or NaN loss is null there, as every non-finite number in --json output).

    \b
    Examples:
      olmo-data inspect-batch runs/tiny/config.yaml --step 40 --decode
      olmo-data inspect-batch configs/tiny.yaml --step 40 --rank 1 --world-size 2 --json
      olmo-data inspect-batch runs/tiny/config.yaml --step 40 --sort loss
    """
    from olmo_data.run import format_report, sort_instances
    from olmo_data.run import inspect_batch as inspect

    report = inspect(
        config,
        step=step,
        batch_index=batch_index,
        rank=rank,
        world_size=world_size,
        order=order,
        decode=decode,
        tokenizer=tokenizer,
        verify_data=not no_verify_data,
        save_folder=save_folder,
    )
    sort_instances(report, sort)
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(format_report(report, max_tokens=max_tokens))
