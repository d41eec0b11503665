"""Entry point: `python -m olmo_train CONFIG [--key=value ...]`, or the same under `torchrun`."""

import os
import signal
import sys
import threading
import time


def follow_launcher(grace_s: float = 30.0) -> None:
    """Under torchrun, end this rank when the launcher is gone. torchrun starts each rank in a session of its own,
    so a launcher killed with SIGKILL (an out-of-memory killer, a scheduler) takes nothing with it, and its ranks
    would train on to the end, unseen. A thread watches the parent: once it is gone, the rank is sent SIGTERM (it
    saves a checkpoint at the next step and stops, as when preempted) and, should that not end it within
    `grace_s`, SIGKILL, as torchrun itself escalates. (`olmo-train train --nproc N` ties torchrun to itself too.)"""
    parent = os.getppid()
    if "TORCHELASTIC_RUN_ID" not in os.environ or parent == 1:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        print(f"the launcher (pid {parent}) is gone: stopping this rank", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="follow-launcher", daemon=True).start()


follow_launcher()  # first: the parent is known for certain only before it can die

# Before torch loads: the BLAS and OpenMP runtimes read these once, and a team resized by load would split a
# reduction differently from run to run (olmo_train/train/reproducible.py). A value the user set is kept.
for _name in ("MKL_DYNAMIC", "OMP_DYNAMIC"):
    os.environ.setdefault(_name, "FALSE")

from olmo_train.train import main  # noqa: E402  (after the environment above)

if __name__ == "__main__":
    code = main()  # everything is written and closed by now: checkpoints, metrics, the lock, the process group
    # End without the interpreter's teardown: under load, a 2-rank gloo run that had finished (its last log line
    # written, exit status about to be 0) was seen to abort there, rarely, with "terminate called without an
    # active exception" (a C++ thread destroyed unjoined during the teardown), which fails the launch as a whole.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
