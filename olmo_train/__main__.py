"""Entry point: `python -m olmo_train CONFIG [--key=value ...]`, or the same under `torchrun`."""

import os
import sys

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
