"""The trainer on a disk that fills up under one rank: `torchrun ... tests/train/full_disk_trainer.py CONFIG`.

The RNG state file of rank $FULL_DISK_RANK in the save of step $FULL_DISK_STEP is refused partway (ENOSPC), as on
a node whose disk filled while the others wrote their parts; every other write goes through. A test driver, not a
test module: the refusal has to happen inside a process torchrun starts.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from olmo_train.checkpoint import integrity
from olmo_train.train import main

_real_torch_save = integrity.Recorder.torch_save


def _torch_save(self: integrity.Recorder, obj: Any, name: str) -> None:
    refused = os.environ.get("RANK") == os.environ["FULL_DISK_RANK"] and name.startswith("rng/")
    if refused and self.root.name == f".tmp-step{os.environ['FULL_DISK_STEP']}":
        (self.root / name).write_bytes(b"the first bytes")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    _real_torch_save(self, obj, name)


if __name__ == "__main__":
    integrity.Recorder.torch_save = _torch_save  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
