"""`olmo-train soup`: the weighted mean of several checkpoints' model weights, as one unsharded checkpoint."""

from __future__ import annotations

import time

import click

from olmo_cli.options import Command


@click.command("soup", cls=Command)
@click.argument("checkpoints", nargs=-1, required=True)
@click.option("--destination", required=True, help="The local checkpoint directory to create.")
@click.option(
    "--weights",
    default=None,
    help="Comma-separated weights, one per checkpoint, normalised to sum to 1 [default: equal weights].",
)
def soup(checkpoints: tuple[str, ...], destination: str, weights: str | None) -> None:
    """Average the model weights of CHECKPOINTS (two or more stepN/ or stepN-unsharded/ directories or URLs of one
    architecture, saved by any number of processes) into an unsharded checkpoint at DESTINATION, as OLMo 2 souped
    its stage-2 anneals. Read tensor by tensor: memory holds about two tensors, not the models. The result has
    checksums.json and a trainer_state.json whose lineage names every parent with its weight; verify, export-hf,
    generate and fine-tuning (--load_path=DESTINATION --reset_trainer_state) take it.

    \b
    Examples:
      olmo-train soup runs/anneal-42/step1000 runs/anneal-666/step1000 --destination runs/soup
      olmo-train soup A B C --weights 0.5,0.25,0.25 --destination runs/soup3
    """
    from olmo_train.checkpoint import average_checkpoints, parse_weights

    t0 = time.perf_counter()
    dest = average_checkpoints(list(checkpoints), destination, parse_weights(weights, len(checkpoints)))
    click.echo(str(dest))
    click.echo(f"souped {len(checkpoints)} checkpoints in {time.perf_counter() - t0:.1f} s", err=True)
