"""`olmo-data trace`: which training steps saw a document, a source file's documents, or a passage."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json, progress_option
from olmo_data.errors import DataError


@click.command("trace", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--document", "document_ids", multiple=True, metavar="ID", help="A document id; repeat for several.")
@click.option(
    "--document-list", type=click.Path(dir_okay=False), default=None, help="A file of document ids, one per line."
)
@click.option("--source", "source_glob", default=None, metavar="GLOB", help="Every document of these source files.")
@click.option("--text", default=None, help="A passage: its tokens are searched for in the token files.")
@click.option("--tokens", default=None, metavar="ID,ID,...", help="A token id sequence to search for.")
@click.option("--spans", default=None, metavar="TEXT", help="A text: its maximal spans found in the training data.")
@click.option("--min-tokens", type=int, default=8, show_default=True, help="The shortest span --spans reports.")
@click.option(
    "--max-places",
    type=int,
    default=1000,
    show_default=True,
    help="Places of a span --spans lists and traces to steps; the rest are counted.",
)
@click.option("--tokenizer", "-t", default=None, help="Tokenizer for --text (default: the one the manifest records).")
@click.option("--steps", default=None, metavar="A..B", help="Steps to look at (1-based) [default: the whole run].")
@click.option("--world-size", type=int, default=None, help="Also say which rank trained each place.")
@click.option("--order", default=None, help="Order directory, file or URL (default: from the config).")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Processes for the --text scan.")
@click.option(
    "--no-lineage",
    is_flag=True,
    help="Trace this run's steps only, not those of the checkpoints it started from (load_path, lineage).",
)
@click.option("--index-dir", default=None, help="Where `olmo-data index` put the index [default: beside the tokens].")
@click.option("--no-index", is_flag=True, help="Scan the token files even where a suffix index exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@progress_option
def trace(
    config: str,
    document_ids: tuple[str, ...],
    document_list: str | None,
    source_glob: str | None,
    text: str | None,
    tokens: str | None,
    spans: str | None,
    min_tokens: int,
    max_places: int,
    tokenizer: str | None,
    steps: str | None,
    world_size: int | None,
    order: str | None,
    processes: int,
    no_lineage: bool,
    index_dir: str | None,
    no_index: bool,
    as_json: bool,
    progress: bool | None,
) -> None:
    """The reverse of inspect-batch: every step of CONFIG's run that trained on a token of the given documents
    (by id, or every document of some source files) or of a passage (by text or token ids), with the position in
    the global batch, the rank, the instance, and which tokens of the document and of the instance.

    --spans TEXT lists the maximal spans of the text (at least --min-tokens tokens) that the training data holds
    verbatim, each with its documents and the steps that trained on it: of its first --max-places places (by file,
    then position), the others counted (--json: "count", "unlisted"). --text, --tokens and --spans use the
    suffix index `olmo-data index` builds when there is one (same answers as the scan, in a fraction of a second).

    Works for any run config, this project's or OLMo's (with data.order_path at its published order); through
    mixtures (a repeated source is found at each repetition); on SFT data it also counts the supervised tokens.

    A run that started from another run's checkpoint (a stage 2: load_path with reset_trainer_state or
    restore_dataloader: false, or checkpoints that record lineage) is traced with its ancestors: for each, the
    steps of its run up to the checkpoint handed on, labelled by run, config and checkpoint, and the tokens each
    stage trained (--no-lineage: this run only).

    \b
    Examples:
      olmo-data trace runs/tiny/config.yaml --document stdlib-0000.jsonl.gz:12
      olmo-data trace configs/tiny.yaml --source '*/json/*' --steps 1..50 --world-size 2 --json
      olmo-data trace configs/tiny.yaml --text "def __init__(self" --processes 2
      olmo-data trace runs/tiny/config.yaml --spans "$(cat generated.txt)" --min-tokens 12
    """
    if spans is not None:
        if document_ids or document_list or source_glob or text is not None or tokens is not None:
            raise DataError("--spans takes a text alone: give documents, --text, --tokens or --spans")
        from olmo_data.trace import format_spans, trace_spans

        found = trace_spans(
            config,
            spans,
            min_tokens=min_tokens,
            max_places=max_places,
            tokenizer=tokenizer,
            steps=steps,
            world_size=world_size,
            order=order,
            processes=processes,
            progress=progress,
            index_dir=index_dir,
            use_index=not no_index,
        )
        if as_json:
            echo_json(found.to_json())
        else:
            click.echo(format_spans(found))
        return
    from olmo_data.trace import format_chain, trace_chain

    report = trace_chain(
        config,
        document_ids=document_ids,
        document_list=document_list,
        source_glob=source_glob,
        text=text,
        tokens=tokens,
        tokenizer=tokenizer,
        steps=steps,
        world_size=world_size,
        order=order,
        processes=processes,
        progress=progress,
        lineage=not no_lineage,
        index_dir=index_dir,
        use_index=not no_index,
    )
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(format_chain(report))
