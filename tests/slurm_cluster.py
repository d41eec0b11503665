"""A real Slurm for the tests of the Slurm scripts, and the uninterrupted run those tests compare against.

`local_slurm` starts the cluster a developer starts by hand (scripts/local_slurm.sh: a controller and two node
daemons on loopback, in a temporary directory) and stops it, by the daemons' process ids, when the tests end. Where
the Slurm binaries are missing, the tests that need it skip and say how to install them.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCAL_SLURM = REPO / "scripts" / "local_slurm.sh"
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running local cluster: `env` is what its commands and jobs need (SLURM_CONF, this Python's bin first on
    PATH, so that `python`, `torchrun` and `olmo-data` in the scripts are this checkout's)."""

    directory: Path
    env: dict[str, str]

    def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(args, env={**self.env, **(env or {})}, text=True, capture_output=True, timeout=60)
        assert proc.returncode == 0, f"{' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit; returns the job id. `env` reaches the job (sbatch exports the submitting environment)."""
        return self.run("sbatch", "--parsable", *args, env=env).strip().split(";")[0]

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields of one job (or array task `J_I`)."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o", job)))

    def describe(self, info: dict[str, str]) -> str:
        """A job's state, reason and exit code, then the end of its output: what a failed test needs to say."""
        out = Path(info.get("StdOut", ""))
        tail = out.read_text()[-4000:] if out.is_file() else "(no output file)"
        return f"job {info['JobId']} {info['JobState']} ({info['Reason']}, exit {info['ExitCode']}); output:\n{tail}"

    def wait(self, job: str, *states: str, timeout: float = 240) -> dict[str, str]:
        """Wait until the job is in one of `states`; a job that ends in another state fails the test at once."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
        deadline = time.time() + timeout
        while True:
            info = self.job(job)
            if info["JobState"] in states:
                return info
            assert info["JobState"] not in final, f"expected {states}: {self.describe(info)}"
            assert time.time() < deadline, f"expected {states} within {timeout} s: {self.describe(info)}"
            time.sleep(0.3)

    def release(self, job: str) -> None:
        """Start a requeued job now: Slurm holds one for about two minutes (its BeginTime). Not within the second
        in which its previous run ended, though: the node revoked that run's credential with a time in whole
        seconds, and a new credential of the same second counts as revoked ("Job credential revoked": FAILED)."""
        time.sleep(math.floor(time.time()) + 1.05 - time.time())
        self.run("scontrol", "update", f"JobId={job}", "StartTime=now")

    def wait_requeued_and_release(self, job: str, restarts: int = 1) -> None:
        """Wait until the job is back in the queue after its `restarts`-th requeue, and let it start again."""
        deadline = time.time() + 120
        while (info := self.job(job))["JobState"] != "PENDING" or int(info["Restarts"]) < restarts:
            assert info["JobState"] in ("RUNNING", "COMPLETING", "PENDING"), f"not requeued: {self.describe(info)}"
            assert time.time() < deadline, f"not requeued within 120 s: {self.describe(info)}"
            time.sleep(0.3)
        self.release(job)


@contextlib.contextmanager
def local_slurm(directory: Path) -> Iterator[SlurmCluster]:
    """scripts/local_slurm.sh start/stop around the block; skips the test where Slurm is not installed."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} not found); "
            "Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client"
        )
    proc = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(directory)], text=True, capture_output=True)
    assert proc.returncode == 0, f"the local Slurm did not start:\n{proc.stdout}{proc.stderr}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # not a job of an outer Slurm
    env.update(
        SLURM_CONF=str(directory / "slurm.conf"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    try:
        yield SlurmCluster(directory, env)
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop", str(directory)], capture_output=True, timeout=60)


_uninterrupted: dict[str, Path] = {}


def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny 2-process run of tests/train/test_train_e2e.py in one go (`torchrun --standalone`), once per session:
    what every launcher test must reproduce bit for bit. Its folder holds `tokens/`, `config.yaml` and `run/`."""
    from tests.train.test_train_e2e import launch, tiny_config, write_tokens  # torch: only for the training tests

    if "run" not in _uninterrupted:
        tmp = tmp_path_factory.mktemp("uninterrupted")
        launch(tiny_config(tmp, write_tokens(tmp / "tokens")), 2)
        _uninterrupted["run"] = tmp
    return _uninterrupted["run"]
