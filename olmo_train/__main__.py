"""Entry point: `python -m olmo_train CONFIG [--key=value ...]`, or the same under `torchrun`."""

import os
import sys

# Before torch loads: the BLAS and OpenMP runtimes read these once, and a team resized by load would split a
# reduction differently from run to run (olmo_train/train/reproducible.py). A value the user set is kept.
for _name in ("MKL_DYNAMIC", "OMP_DYNAMIC"):
    os.environ.setdefault(_name, "FALSE")

from olmo_train.train import main  # noqa: E402  (after the environment above)

if __name__ == "__main__":
    sys.exit(main())
