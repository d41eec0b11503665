"""`olmo-train export-hf`: a checkpoint as a Hugging Face `transformers` model directory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from olmo_cli.options import Command


@click.command("export-hf", cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--destination", type=click.Path(path_type=Path), required=True, help="Directory to create.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default="float32",
    show_default=True,
    help="Dtype of the written weights.",
)
@click.option(
    "--tokenizer",
    "-t",
    default=None,
    help="tokenizer.json to ship [default: the one the run's data manifest records]; its SHA-256 must be the "
    "manifest's unless --force.",
)
@click.option("--force", is_flag=True, help="Export with a tokenizer whose SHA-256 differs from the manifest's.")
@click.option(
    "--check", is_flag=True, help="Also run ours and the exported model block by block and name the first that differs."
)
def export_hf(checkpoint: Path, destination: Path, dtype: str, tokenizer: str | None, force: bool, check: bool) -> None:
    """Write CHECKPOINT (stepN or stepN-unsharded, with its config.yaml) as a directory that
    `AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load natively:
    config.json (model_type olmo2 or llama), safetensors weights, generation_config.json and the tokenizer the
    data was made with. The directory is loaded back before it gets its name.

    \b
    Examples:
      olmo-train export-hf runs/tiny/step100 --destination runs/tiny-hf
      olmo-train export-hf runs/tiny/step100 --destination runs/tiny-hf-bf16 --dtype bfloat16 --check
      python -c "from transformers import pipeline; print(pipeline('text-generation', 'runs/tiny-hf')('def '))"
    """
    from olmo_train.convert import export_hf as export

    t0 = time.perf_counter()
    dest = export(checkpoint, destination, dtype=dtype, tokenizer=tokenizer, force=force, check=check)
    config = json.loads((dest / "config.json").read_text())
    size = sum(p.stat().st_size for p in dest.glob("*.safetensors"))
    tokenizer_note = "with tokenizer" if (dest / "tokenizer.json").is_file() else "no tokenizer"
    click.echo(
        f"{dest}: {config['model_type']} {config['num_hidden_layers']} layers, {size / 1e6:.1f} MB {dtype}, "
        f"{tokenizer_note}{', checked' if check else ''} ({time.perf_counter() - t0:.1f} s)"
    )
