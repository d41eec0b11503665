"""`olmo-train train CONFIG [--nproc N] [--key=value ...]`: one way to train, on one process or many.

One process trains in this one (as `python -m olmo_train`); N > 1 are launched as `torchrun --standalone
--nproc-per-node N -m olmo_train ...` would, so a run started either way writes the same files.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

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
    launcher = subprocess.Popen(command, env=env, preexec_fn=_tied_to(os.getpid()))
    try:
        sys.exit(launcher.wait())
    finally:  # stopped here (Ctrl-C, SIGTERM): torchrun passes the signal on to its ranks, which save and exit
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait()


def _tied_to(parent: int) -> Callable[[], None] | None:
    """What torchrun's process runs before it starts (Linux): SIGTERM to it when this process dies, however it
    dies (`kill -9`, the out-of-memory killer), so that it stops its ranks (each saves and exits, as when
    preempted) instead of training on unseen; a torchrun whose launcher died before this ran exits at once."""
    if not sys.platform.startswith("linux"):
        return None  # elsewhere the ranks' own watch (olmo_train/__main__.py) still ends them once torchrun is gone
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing to load after the fork
    except (OSError, AttributeError):
        return None

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return tie


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
