"""`olmo-train train CONFIG [--nproc N] [--key=value ...]`: one way to train, on one process or many.

One process trains in this one (as `python -m olmo_train`); N > 1 are launched as `torchrun --standalone
--nproc-per-node N -m olmo_train ...` would, so a run started either way writes the same files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import click

from olmo_cli.options import Command


# the config's --key=value overrides are options click does not know: kept, in order, as OVERRIDES
@click.command("train", cls=Command, context_settings={"ignore_unknown_options": True})
@click.argument("config")
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes on this machine: 1 trains in this process, more are launched with torchrun (--standalone).",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def train(ctx: click.Context, config: str, nproc: int, overrides: tuple[str, ...]) -> None:
    """Train the model CONFIG describes (our YAML or OLMo's), with the config's keys overridden by
    --key.sub=value. Reruns resume from the newest checkpoint in its save_folder.

    \b
    Examples:
      olmo-train train configs/tiny.yaml --save_folder=runs/tiny --stop_at=30
      olmo-train train configs/tiny.yaml --nproc 2 --optimizer.learning_rate=1e-3
    """
    args = [config, *overrides]
    if nproc == 1:
        for name in ("MKL_DYNAMIC", "OMP_DYNAMIC"):  # as `python -m olmo_train` sets them, before torch loads
            os.environ.setdefault(name, "FALSE")
        from olmo_train.train import main

        sys.exit(main(args))
    env = dict(os.environ)
    # torchrun prints a banner when it sets OMP_NUM_THREADS=1 itself; setting it here is the same for the ranks
    env.setdefault("OMP_NUM_THREADS", "1")
    if ctx.find_root().params.get("verbose"):  # torchrun's own log lines too (OLMO_VERBOSE is set for the ranks)
        env.setdefault("LOGLEVEL", "INFO")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += ["-m", "olmo_train", *args]
    launcher = subprocess.Popen(command, env=env)
    try:
        sys.exit(launcher.wait())
    finally:  # stopped here (Ctrl-C, SIGTERM): torchrun passes the signal on to its ranks, which save and exit
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait()
