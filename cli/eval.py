"""`olmo-train eval`: OLMo's downstream tasks (ai2-olmo-eval) on a checkpoint or model directory."""

from __future__ import annotations

import click

from olmo_cli.options import Command, echo_json, progress_option


@click.command("eval", cls=Command)
@click.argument("model", required=False)
@click.option("--tasks", default="", help="Comma-separated task labels of ai2-olmo-eval, e.g. piqa,hellaswag,arc_easy.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Requests per forward on each process.")
@click.option("--max-batches", type=int, default=None, help="Batches per task at most, all processes together.")
@click.option("--tokenizer", "-t", default=None, help="tokenizer.json or hub id [default: the model's or its data's].")
@click.option("--device", default=None, help="cpu, cuda, cuda:1, ... [default: the GPU of this rank, else cpu]")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of a table.")
@click.option("--list-tasks", is_flag=True, help="Print every task label ai2-olmo-eval knows and exit.")
@progress_option
def eval_(
    model: str | None,
    tasks: str,
    batch_size: int,
    max_batches: int | None,
    tokenizer: str | None,
    device: str | None,
    as_json: bool,
    list_tasks: bool,
    progress: bool | None,
) -> None:
    """Score MODEL on OLMo's downstream tasks with the metrics OLMo reports (accuracy, length-normalised accuracy,
    cross-entropy, bits per byte: every one ai2-olmo-eval computes), as the training loop logs them.

    MODEL is a checkpoint the trainer wrote (stepN or stepN-unsharded), one `import-hf` or `import-olmo` made, a
    `transformers` model directory, OLMo's own checkpoint, or a checkpoint URL. Needs the `eval` extra
    (pip install 'olmo-data[eval]').

    \b
    Examples:
      olmo-train eval runs/tiny/step100 --tasks piqa,arc_easy --max-batches 10
      torchrun --nproc-per-node 8 -m olmo_cli.train_main eval runs/7b/step1000 --tasks mmlu_stem_mc_5shot --json
    """
    from olmo_data.display import Stages

    labels = [t.strip() for t in tasks.split(",") if t.strip()]
    if not list_tasks and (model is None or not labels):
        raise click.UsageError("give MODEL and --tasks (or --list-tasks)")
    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise click.BadParameter("must be positive", param_hint="--batch-size/--max-batches")
    # the bar opens before torch and ai2-olmo-eval load (seconds): feedback from the first second on
    loading = Stages("loading", ["torch", "model", "tokenizer", *labels], progress=False if list_tasks else progress)
    loading.start("torch")
    try:
        from olmo_train.train import evaluate_model, task_labels
    except BaseException:
        loading.close(finished=False)
        raise
    if list_tasks:
        click.echo("\n".join(task_labels()))
        return
    assert model is not None  # checked above
    report = evaluate_model(
        model,
        labels,
        batch_size=batch_size,
        max_batches=max_batches,
        tokenizer=tokenizer,
        device=device,
        progress=progress,
        loading=loading,
    )
    if not report.is_main:
        return
    if as_json:
        echo_json(report.as_json())
        return
    click.echo(report.table())
    requests = sum(report.requests.values())
    click.echo(
        f"{len(labels)} task(s), {requests} requests on {report.world_size} process(es) in {report.seconds:.2f} s "
        f"(loading {report.load_seconds:.2f} s)",
        err=True,
    )
