"""Entry point of `olmo-train`: training (`train`, in-process or through torchrun for several processes) and
the model side (unshard, export to and import from Hugging Face, import from OLMo, generate, eval, soup, verify).

`torchrun -m olmo_train CONFIG` trains as `olmo-train train` does; the other commands work on the checkpoints it
writes, in one plain process. Subcommands are imported lazily so that `--help` starts fast and torch is loaded
only when needed.
"""

from __future__ import annotations

import click

from olmo_cli.main import LazyGroup
from olmo_cli.options import setup_logging
from olmo_data import __version__

TRAIN_COMMANDS: dict[str, str] = {
    "train": "olmo_cli.train:train",
    "unshard": "olmo_cli.unshard:unshard",
    "export-hf": "olmo_cli.export_hf:export_hf",
    "import-hf": "olmo_cli.import_hf:import_hf",
    "import-olmo": "olmo_cli.import_olmo:import_olmo",
    "import-olmo-core": "olmo_cli.import_olmo_core:import_olmo_core",
    "generate": "olmo_cli.generate:generate",
    "verify": "olmo_cli.verify:verify",
    "eval": "olmo_cli.eval:eval_",
    "soup": "olmo_cli.soup:soup",
}


class TrainGroup(LazyGroup):
    lazy_commands = TRAIN_COMMANDS


@click.group(cls=TrainGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="olmo-train")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages, and show third-party warnings.")
def main(verbose: bool) -> None:
    """Move models in and out of training: unshard checkpoints, export to and import from Hugging Face
    `transformers`, import OLMo's own checkpoints, generate text, average checkpoints (soup), and verify that a
    checkpoint is intact and safe to load.

    Train with `olmo-train train CONFIG [--nproc N]` (torchrun for N > 1); its checkpoints (stepN/,
    stepN-unsharded/) are what the other commands read.
    """
    setup_logging(verbose)


if __name__ == "__main__":
    main()
