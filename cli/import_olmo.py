"""`olmo-train import-olmo`: a checkpoint of OLMo's own trainer as a checkpoint of ours."""

from __future__ import annotations

import time
from pathlib import Path

import click

from olmo_cli.options import Command


@click.command("import-olmo", cls=Command)
@click.argument("checkpoint")
@click.option("--destination", type=click.Path(path_type=Path), required=True, help="Directory to create.")
@click.option(
    "--tokenizer",
    "-t",
    default=None,
    help="The tokenizer.json the model was trained with (OLMo's checkpoints carry none; their config.yaml names it "
    "as tokenizer.identifier), shipped in the checkpoint for generate and export-hf.",
)
def import_olmo(checkpoint: str, destination: Path, tokenizer: str | None) -> None:
    """Make CHECKPOINT, an unsharded checkpoint of OLMo's trainer (a stepN-unsharded directory or URL holding
    model.pt and config.yaml; OLMo-1 or OLMo-2), into an unsharded checkpoint of ours: model.pt,
    trainer_state.json, config.yaml whose model section describes it (load_path set to it, reset_trainer_state
    true) and the tokenizer if given. OLMo options this model does not compute (ALiBi, biases, clip_qkv, llama or
    MoE blocks) are refused by their config key.

    \b
    Examples:
      olmo-train import-olmo https://olmo-checkpoints.org/ai2-llm/peteish1/step10000-unsharded \\
          --destination runs/olmo2-1b-step10000 -t OLMo/tokenizers/allenai_dolma2.json
      olmo-train generate runs/olmo2-1b-step10000 --prompt "Language models are" --max-steps 20
      olmo-train export-hf runs/olmo2-1b-step10000 --destination runs/olmo2-1b-step10000-hf
      torchrun --nproc-per-node 8 -m olmo_train runs/olmo2-1b-step10000/config.yaml --data.paths=[runs/tokens] \\
          --save_folder=runs/olmo2-1b-continued --max_duration=1000
    """
    from olmo_train.checkpoint import TOKENIZER_FILE, read_config
    from olmo_train.convert import import_olmo as run_import

    t0 = time.perf_counter()
    dest = run_import(checkpoint, destination, tokenizer=tokenizer)
    m = read_config(dest).model
    kind = "OLMo-2 block" if m.norm_after else f"pre-norm {m.layer_norm_type} block"
    tokenizer_note = "with tokenizer" if (dest / TOKENIZER_FILE).is_file() else "no tokenizer"
    click.echo(
        f"{dest}: {m.n_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, {kind}, {tokenizer_note} "
        f"({time.perf_counter() - t0:.1f} s); train with --load_path={dest} --reset_trainer_state (see "
        f"{dest}/config.yaml)"
    )
