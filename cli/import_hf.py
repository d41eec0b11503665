"""`olmo-train import-hf`: a Hugging Face `transformers` model as a checkpoint to fine-tune from."""

from __future__ import annotations

import time
from pathlib import Path

import click

from olmo_cli.options import Command


@click.command("import-hf", cls=Command)
@click.argument("model")
@click.option("--destination", type=click.Path(path_type=Path), required=True, help="Directory to create.")
@click.option(
    "--check",
    is_flag=True,
    help="Also run ours and the transformers model block by block; name the first that differs.",
)
def import_hf(model: str, destination: Path, check: bool) -> None:
    """Make MODEL (a local transformers directory with config.json and safetensors, or a hub id where a network
    exists; model_type olmo2 or llama) into an unsharded checkpoint: model.pt, trainer_state.json, the
    tokenizer files, and a config.yaml whose model section describes it, with load_path set to it and
    reset_trainer_state true. Fine-tune it by giving that config the data.

    \b
    Examples:
      olmo-train import-hf allenai/OLMo-2-0425-1B --destination runs/olmo2-1b
      olmo-data prepare-tulu -d tulu.jsonl -t runs/olmo2-1b/tokenizer.json --sequence-length 4096 \\
          --destination runs/sft-data
      torchrun --nproc-per-node 8 -m olmo_train runs/olmo2-1b/config.yaml --data.paths=[runs/sft-data] \\
          --save_folder=runs/olmo2-1b-sft --max_duration=1000 --global_train_batch_size=64
    """
    from olmo_train.checkpoint import TOKENIZER_FILE, read_config
    from olmo_train.convert import import_hf as run_import

    t0 = time.perf_counter()
    dest = run_import(model, destination, check=check)
    m = read_config(dest).model
    tokenizer_note = "with tokenizer" if (dest / TOKENIZER_FILE).is_file() else "no tokenizer"
    click.echo(
        f"{dest}: {m.n_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, {tokenizer_note}"
        f"{', checked' if check else ''} ({time.perf_counter() - t0:.1f} s); train with "
        f"--load_path={dest} --reset_trainer_state (see {dest}/config.yaml)"
    )
