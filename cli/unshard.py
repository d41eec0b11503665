"""`olmo-train unshard`: a sharded checkpoint as model.pt + optim.pt, in one CPU process."""

from __future__ import annotations

import time
from pathlib import Path

import click

from olmo_cli.options import Command


@click.command("unshard", cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--destination",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory to create [default: CHECKPOINT-unsharded beside CHECKPOINT; CHECKPOINT-model with --model-only].",
)
@click.option(
    "--model-only",
    is_flag=True,
    help="Leave out the optimizer state: for export, generation and --reset_trainer_state fine-tuning, "
    "not for continuing the run.",
)
def unshard(checkpoint: Path, destination: Path | None, model_only: bool) -> None:
    """Turn a sharded checkpoint (stepN/, written by any number of processes) into an unsharded one (model.pt,
    optim.pt, rng/, config.yaml, trainer_state.json), the same files the trainer writes at
    save_interval_unsharded. Runs in one process on CPU; no GPUs or process group needed.

    \b
    Examples:
      olmo-train unshard runs/tiny/step100                  # -> runs/tiny/step100-unsharded
      olmo-train unshard runs/tiny/latest --destination /tmp/tiny-100 --model-only
      python -m olmo_train configs/tiny.yaml --load_path=runs/tiny/step100-unsharded
    """
    from olmo_train.checkpoint import MODEL_FILE, OPTIM_FILE, read_trainer_state
    from olmo_train.convert import unshard as unshard_checkpoint

    t0 = time.perf_counter()
    dest = unshard_checkpoint(checkpoint, destination, model_only=model_only)
    written = [name for name in (MODEL_FILE, OPTIM_FILE) if (dest / name).exists()]
    sizes = ", ".join(f"{name} {(dest / name).stat().st_size / 1e6:.1f} MB" for name in written)
    click.echo(str(dest))
    click.echo(
        f"unsharded step {read_trainer_state(dest).step} ({sizes}) in {time.perf_counter() - t0:.1f} s", err=True
    )
