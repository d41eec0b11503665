"""`olmo-data tokenize`."""

from __future__ import annotations

import click

from cli.options import Command, backend_option, document_options, progress_option
from olmo_data.tokenize import DEFAULT_MAX_TOKENS_PER_FILE, TokenizeOptions
from olmo_data.tokenize import tokenize as run_tokenize


@click.command(cls=Command)
@document_options
@click.option(
    "--tokenizer",
    "-t",
    required=True,
    metavar="TOK",
    help="A tokenizer.json path, a .tiktoken ranks file, or a Hugging Face hub id (needs a network).",
)
@click.option("--destination", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Worker processes (over files).")
@click.option("--dtype", type=click.Choice(["uint16", "uint32"]), help="Token dtype [default: smallest that fits].")
@click.option("--eos-token-id", type=int, help="Appended to every document [default: the tokenizer's EOS].")
@click.option("--bos-token-id", type=int, help="Prepended to every document [default: none].")
@click.option(
    "--max-tokens-per-file",
    type=int,
    default=DEFAULT_MAX_TOKENS_PER_FILE,
    show_default=True,
    help="Start a new part file past this many tokens (documents are never split).",
)
@backend_option
@progress_option
def tokenize(
    documents: tuple[str, ...],
    text_field: str,
    id_field: str,
    skip_bad_documents: bool,
    tokenizer: str,
    destination: str,
    processes: int,
    dtype: str | None,
    eos_token_id: int | None,
    bos_token_id: int | None,
    max_tokens_per_file: int,
    backend: str,
    progress: bool | None,
) -> None:
    """Tokenize documents into token files compatible with `dolma tokens`.

    Writes DIR/part-*.npy (headerless token arrays), DIR/part-*.csv.gz (start,end,id,src,loc per document) and
    DIR/manifest.json. Output is byte-identical whatever --processes is; a rerun skips finished inputs.

    \b
    Examples:
      olmo-data tokenize --documents runs/demo/documents/*.jsonl.gz --tokenizer runs/demo/tokenizer.json \\
          --destination runs/demo/tokens --processes 2
    """
    options = TokenizeOptions(
        tokenizer=tokenizer,
        backend=backend,
        dtype=dtype,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
        max_tokens_per_file=max_tokens_per_file,
        text_field=text_field,
        id_field=id_field,
        skip_bad_documents=skip_bad_documents,
    )
    summary = run_tokenize(documents, destination, options, processes=processes, progress=progress)
    for example in summary.bad_examples:
        click.echo(f"skipped: {example}", err=True)
    click.echo(summary.line())
