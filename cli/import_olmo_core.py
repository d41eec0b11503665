"""`olmo-train import-olmo-core`: a checkpoint of OLMo-core's trainer as a checkpoint of ours."""

from __future__ import annotations

import time
from pathlib import Path

import click

from olmo_cli.options import Command


@click.command("import-olmo-core", cls=Command)
@click.argument("checkpoint")
@click.option("--destination", type=click.Path(path_type=Path), required=True, help="Directory to create.")
@click.option(
    "--tokenizer",
    "-t",
    default=None,
    help="The tokenizer.json the model was trained with (OLMo-core's checkpoints carry none; their config.json "
    "names it as dataset.tokenizer.identifier), shipped in the checkpoint for generate and export-hf.",
)
@click.option(
    "--config",
    "config",
    default=None,
    help="The run's config.json, when the step folder has none (OLMo-core's ConfigSaverCallback writes it there).",
)
@click.option(
    "--weights-only", is_flag=True, help="Import the model alone, without the optimizer state the checkpoint holds."
)
def import_olmo_core(
    checkpoint: str, destination: Path, tokenizer: str | None, config: str | None, weights_only: bool
) -> None:
    """Make CHECKPOINT, a step folder of OLMo-core's trainer (stepN/ holding model_and_optim/ and config.json),
    into an unsharded checkpoint of ours: model.pt, optim.pt (OLMo-core's AdamW or SkipStepAdamW state, unless
    --weights-only), trainer_state.json (its lineage names the source, its step and tokens), config.yaml whose
    model and optimizer sections describe it (load_path set to it, reset_trainer_state true) and the tokenizer if
    given. OLMo-core model options this model does not compute (biases, MoE, sliding windows, gated attention,
    complex RoPE, per-head QK-norm, ...) are refused by their config key.

    \b
    Examples:
      olmo-train import-olmo-core runs/olmo2-1b/step10000 --destination runs/olmo2-1b-step10000 \\
          -t tokenizers/allenai_dolma2.json
      olmo-train generate runs/olmo2-1b-step10000 --prompt "Language models are" --max-steps 20
      torchrun --nproc-per-node 8 -m olmo_train runs/olmo2-1b-step10000/config.yaml --data.paths=[runs/tokens] \\
          --save_folder=runs/olmo2-1b-continued --max_duration=1000
    """
    from olmo_train.checkpoint import OPTIM_FILE, TOKENIZER_FILE, read_config
    from olmo_train.convert import import_olmo_core as run_import

    t0 = time.perf_counter()
    dest = run_import(checkpoint, destination, tokenizer=tokenizer, config=config, weights_only=weights_only)
    m = read_config(dest).model
    kind = "OLMo-2 block" if m.norm_after else f"pre-norm {m.layer_norm_type} block"
    optim = "with optimizer state" if (dest / OPTIM_FILE).is_file() else "weights only"
    tokenizer_note = "with tokenizer" if (dest / TOKENIZER_FILE).is_file() else "no tokenizer"
    click.echo(
        f"{dest}: {m.n_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, {kind}, {optim}, {tokenizer_note} "
        f"({time.perf_counter() - t0:.1f} s); train with --load_path={dest} (see {dest}/config.yaml)"
    )
