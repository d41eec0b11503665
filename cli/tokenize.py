"""`olmo-data tokenize`."""

from __future__ import annotations

import os

import click

from olmo_cli.options import Command, backend_option, document_options, progress_option
from olmo_data.errors import DataError
from olmo_data.tokenize import DEFAULT_MAX_TOKENS_PER_FILE, Shard, TokenizeOptions, merge_shards
from olmo_data.tokenize import tokenize as run_tokenize


class ShardType(click.ParamType):
    """`--shard I/N`, checked by the library's own parser so that its message is the one users see."""

    name = "I/N"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Shard:
        if isinstance(value, Shard):
            return value
        try:
            return Shard.parse(str(value))
        except DataError as e:
            self.fail(str(e), param, ctx)


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
@click.option(
    "--shard",
    type=ShardType(),
    help="Tokenize only inputs I, I+N, I+2N, ... (I from 0): one of N machines writing into one --destination. "
    "In a Slurm array task: SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT. The last shard to finish writes "
    "manifest.json; the directory ends as one machine would have written it.",
)
@click.option(
    "--merge",
    is_flag=True,
    help="After all shards: write manifest.json (refused, naming them, while inputs are missing). Tokenizes nothing.",
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
    shard: Shard | None,
    merge: bool,
    backend: str,
    progress: bool | None,
) -> None:
    """Tokenize documents into token files compatible with `dolma tokens`.

    Writes DIR/part-*.npy (headerless token arrays), DIR/part-*.csv.gz (start,end,id,src,loc per document) and
    DIR/manifest.json. Output is byte-identical whatever --processes is, or however many machines share the work
    (--shard, a Slurm array: scripts/slurm_tokenize.sh); a rerun skips finished inputs.

    \b
    Examples:
      olmo-data tokenize --documents runs/demo/documents/*.jsonl.gz --tokenizer runs/demo/tokenizer.json \\
          --destination runs/demo/tokens --processes 2
      olmo-data tokenize -d runs/demo/documents/*.jsonl.gz -t runs/demo/tokenizer.json \\
          --destination runs/demo/tokens --shard 0/3    # on machine 0 of 3 (and 1/3, 2/3 on the others)
      olmo-data tokenize -d runs/demo/documents/*.jsonl.gz -t runs/demo/tokenizer.json \\
          --destination runs/demo/tokens --merge        # after all shards: check, write manifest.json
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
    if merge:
        if shard is not None:
            raise click.UsageError("--merge runs once, after all shards: leave out --shard")
        click.echo(merge_shards(documents, destination, options).merge_line())
        return
    if shard is None and (shard := Shard.from_slurm_array(os.environ)) is not None:
        click.echo(f"shard {shard} (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)", err=True)
    summary = run_tokenize(documents, destination, options, processes=processes, progress=progress, shard=shard)
    for example in summary.bad_examples:
        click.echo(f"skipped: {example}", err=True)
    click.echo(summary.line())
