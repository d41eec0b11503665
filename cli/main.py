"""Entry point of `olmo-data`. Subcommands are imported lazily so that `--help` and each command start fast.

To add a command, add its name and "module:function" to COMMANDS.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from typing import Any

import click

from olmo_cli.options import StagedGroup, setup_logging
from olmo_data import DataError, __version__
from olmo_data.interrupts import Interrupted, stop_on_signals
from olmo_data.io import remove_live_temporaries

COMMANDS: dict[str, str] = {
    "sample": "olmo_cli.sample:sample",
    "tokenize": "olmo_cli.tokenize:tokenize",
    "demo-data": "olmo_cli.demo:demo_data",
    "build-order": "olmo_cli.build_order:build_order",
    "mix": "olmo_cli.mix:mix",
    "inspect-batch": "olmo_cli.inspect_batch:inspect_batch",
    "trace": "olmo_cli.trace:trace",
    "contamination": "olmo_cli.contamination:contamination",
    "lineage": "olmo_cli.lineage:lineage",
    "index": "olmo_cli.index:index",
    "index-documents": "olmo_cli.index_documents:index_documents",
    "stats": "olmo_cli.stats:stats",
    "spikes": "olmo_cli.spikes:spikes",
    "prepare-tulu": "olmo_cli.prepare_tulu:prepare_tulu",
    "show-document": "olmo_cli.show_document:show_document",
    "view": "olmo_cli.view:view",
}


class LazyGroup(StagedGroup):
    """Imports a command's module only when that command runs; bad input (DataError), SIGTERM and Ctrl-C end in
    one red line (exit status 2, 143 and 130)."""

    lazy_commands: dict[str, str] = COMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.lazy_commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_commands:
            return None
        module, attr = self.lazy_commands[cmd_name].split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    # Commands that leave nothing to finish at exit (their files closed, their workers ended), so that skipping the
    # interpreter's teardown after they succeed loses nothing: a file left open elsewhere would lose its buffer
    fast_exit_commands = frozenset({"tokenize"})
    succeeded: str | None = None  # the command whose `invoke` returned

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The program itself (the `olmo-data` script, `python -m olmo_cli.main`; tests call `main()` instead): after
        a command of `fast_exit_commands` succeeds, it exits without the interpreter's teardown, which frees every
        module and object one by one for nothing (~15 ms of a tokenize's ~250 ms start-up on 2 processes). What
        exiting does for the program is done first: atexit functions (logging's flush, multiprocessing's finalizers,
        temporary directories) and the flush of stdout and stderr; with a thread still running, or a flush failing,
        it exits the usual way."""
        try:
            return self.main(*args, **kwargs)
        except SystemExit as e:
            if e.code not in (0, None) or self.succeeded not in self.fast_exit_commands:
                raise
            if threading.active_count() > 1:
                raise
            atexit._run_exitfuncs()
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):  # a closed pipe, say: Python's own exit reports it
                raise e from None
            os._exit(0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with stop_on_signals():  # SIGTERM and Ctrl-C run the commands' own cleanup, then end here
                result = super().invoke(ctx)
            self.succeeded = ctx.invoked_subcommand
            return result
        except DataError as e:  # bad input: a precise message, no traceback
            click.secho(f"error: {e}", fg="red", err=True)
            sys.exit(2)
        except Interrupted as e:
            remove_live_temporaries()  # one a signal caught between its creation and its owner's cleanup
            click.secho(f"stopped by {e}: nothing half-written is left; rerun to finish", fg="red", err=True)
            sys.exit(e.exit_code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="olmo-data")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages, and show third-party warnings.")
def main(verbose: bool) -> None:
    """Prepare, inspect and mix data for OLMo-style language models.

    The stages: sample documents, tokenize them into token files, (build a data order, mix sources, inspect any
    training batch), and train with `olmo-train train CONFIG` (`--nproc N` for N processes).
    """
    setup_logging(verbose)


if __name__ == "__main__":
    main()
