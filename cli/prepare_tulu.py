"""`olmo-data prepare-tulu`: chat conversations into token ids and label masks for fine-tuning."""

from __future__ import annotations

import click

from olmo_cli.options import Command, backend_option, progress_option
from olmo_data.chat import DEFAULT_PACK_WINDOW, ChatOptions, prepare_chat


@click.command("prepare-tulu", cls=Command)
@click.option(
    "--documents",
    "-d",
    "inputs",
    multiple=True,
    required=True,
    metavar="PATTERN",
    help="Chat files: JSON lines or parquet with `messages` (local, glob, s3://, gs://, http(s)://), or a Hugging Face "
    "dataset id where `datasets` is installed. Several may follow one flag.",
)
@click.option("--tokenizer", "-t", required=True, help="tokenizer.json path, directory, or Hugging Face hub id.")
@click.option("--destination", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--sequence-length", type=int, required=True, help="Tokens per instance (the model's sequence length).")
@click.option(
    "--template",
    default="olmo",
    show_default=True,
    metavar="olmo|tulu|tokenizer|PATH",
    help="Layout: olmo or tulu (docs/data.md), or a chat template rendered by transformers' apply_chat_template: "
    "`tokenizer` (the --tokenizer's chat_template.jinja or tokenizer_config.json beside tokenizer.json) or the "
    "PATH of a Jinja file, a tokenizer_config.json or a directory holding either (needs olmo-data[hf]).",
)
@click.option("--eos-token-id", type=int, default=None, help="Default: the tokenizer's EOS token.")
@click.option("--pad-token-id", type=int, default=None, help="Default: the tokenizer's pad token, else the EOS id.")
@click.option("--pack", is_flag=True, help="Pack several conversations per instance (never split one).")
@click.option(
    "--pack-window",
    type=int,
    default=DEFAULT_PACK_WINDOW,
    show_default=True,
    help="With --pack: how many open instances a conversation may go into (first fit).",
)
@click.option("--skip-bad-documents", is_flag=True, help="Count and skip malformed rows instead of stopping.")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Tokenizer processes.")
@backend_option
@click.option("--split", default="train", show_default=True, help="Split, for Hugging Face dataset ids.")
@progress_option
def prepare_tulu(
    inputs: tuple[str, ...],
    tokenizer: str,
    destination: str,
    sequence_length: int,
    template: str,
    eos_token_id: int | None,
    pad_token_id: int | None,
    pack: bool,
    pack_window: int,
    skip_bad_documents: bool,
    processes: int,
    backend: str,
    split: str,
    progress: bool | None,
) -> None:
    """Tokenize Tulu-format chat data into DESTINATION/input_ids.npy and label_mask.npy for fine-tuning.

    Only the assistant replies are trained (docs/data.md gives each template's exact mask). Point a
    training config's data.paths at DESTINATION (its manifest names the label mask), or at input_ids.npy with
    data.label_mask_paths at label_mask.npy.

    \b
    Examples:
      olmo-data prepare-tulu -d runs/demo/chat/tulu.jsonl -t runs/demo/tokenizer.json \\
          --sequence-length 128 --destination runs/sft-data
      olmo-data prepare-tulu -d chat.jsonl -t models/olmo3/ --template tokenizer \\
          --sequence-length 4096 --destination runs/sft-data
    """
    options = ChatOptions(
        tokenizer=tokenizer,
        seq_len=sequence_length,
        template=template,
        backend=backend,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        pack=pack,
        pack_window=pack_window,
        skip_bad_rows=skip_bad_documents,
        split=split,
    )
    summary = prepare_chat(list(inputs), destination, options, processes=processes, progress=progress)
    click.echo(summary.line())
    for message in summary.bad_examples:
        click.echo(f"  bad row: {message}")
    click.echo(f"wrote {summary.destination}")
