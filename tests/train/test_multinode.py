"""Multi-node launch without Slurm: two `torchrun --nnodes=2` launchers (two "nodes" on loopback) meeting through
the c10d rendezvous give bit for bit the run of one launcher with 2 processes. This is what scripts/slurm_torchrun.sh
does on a cluster, and it runs wherever the tests run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import REPO, free_port, uninterrupted_run
from tests.train.test_train_e2e import STEPS, metrics, tiny_config


@pytest.mark.slow
def test_two_torchrun_launchers_give_the_run_of_one(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = uninterrupted_run(tmp_path_factory)
    config = tiny_config(tmp_path, sorted(str(p) for p in (reference / "tokens").glob("*.npy")))
    endpoint = f"127.0.0.1:{free_port()}"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    launcher += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=two-nodes"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:  # output to files: a launcher blocked on a full pipe would stall the rendezvous
            with log.open("w") as out:
                command = [*launcher, "-m", "olmo_train", str(config)]
                nodes.append(
                    subprocess.Popen(
                        command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        codes = [node.wait(timeout=300) for node in nodes]
    finally:  # one launcher failing leaves the other waiting for its peer: end both, with their processes
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    text = "\n".join(log.read_text() for log in logs)
    assert codes == [0, 0], text
    assert "world size 2" in text and f"finished at step {STEPS}" in text, text
    ref, got = metrics(reference / "run"), metrics(tmp_path / "run")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(ref, got, strict=True):
        assert (a["train/loss"], a["train/batch_fingerprint"], a["train/tokens_seen"]) == (
            b["train/loss"],
            b["train/batch_fingerprint"],
            b["train/tokens_seen"],
        ), f"step {a['step']}"
