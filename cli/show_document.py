"""`olmo-data show-document`: a document of a run's data by id, as text, with the steps that trained on it."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json


@click.command("show-document", cls=Command)
@click.argument("config")
@click.argument("document_id")
@click.option("--tokenizer", "-t", default=None, help="Tokenizer to decode with [default: the one the data records].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def show_document(config: str, document_id: str, tokenizer: str | None, as_json: bool) -> None:
    """Print document DOCUMENT_ID of the data of CONFIG's run (its training config, or the config.yaml in its
    save folder) as text, with its source file and line and the steps whose batches held its tokens.

    \b
    Examples:
      olmo-data show-document runs/tiny/config.yaml stdlib-0000.jsonl.gz:12
      olmo-data show-document configs/tiny.yaml json/__init__.py --json
    """
    from olmo_data.trace import format_document, show_documents

    if not config.endswith((".yaml", ".yml")) and document_id.endswith((".yaml", ".yml")):
        config, document_id = document_id, config  # `show-document ID --config CONFIG`: the same question
    views = show_documents(config, document_id, tokenizer=tokenizer)
    if as_json:
        echo_json([v.to_json() for v in views])
        return
    click.echo("\n\n".join(format_document(v) for v in views))
