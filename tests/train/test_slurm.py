"""The training launchers on a real (local) Slurm, CPU and gloo: scripts/slurm_train.sh (one task per process)
stopped the three ways a cluster stops a job, and scripts/slurm_torchrun.sh (one torchrun per node) on two nodes.

Each time the job must save, be requeued, resume, and end with the metrics of an uninterrupted run: the same losses
bit for bit, the same batch fingerprints and token counts, every step exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import REPO, SlurmCluster, free_port, local_slurm, uninterrupted_run
from tests.train.test_train_e2e import GBS, SEQ, STEPS, metrics, tiny_config

# rank 0 pauses this long inside every checkpoint write (a test hook): the signal arrives mid-run, not after it
SAVE_PAUSE = "1"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uninterrupted_run(tmp_path_factory)


def tokens(reference: Path) -> list[str]:
    return sorted(str(p) for p in (reference / "tokens").glob("*.npy"))


def submit(
    slurm: SlurmCluster, tmp: Path, reference: Path, script: str, *sbatch_args: str, env: dict[str, str] | None = None
) -> str:
    """Submit a launcher script with the tiny config, overriding its #SBATCH requests for a GPU cluster."""
    config = tiny_config(tmp, tokens(reference))
    return slurm.sbatch(
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        f"--output={tmp}/job-%j.out",
        f"--chdir={REPO}",
        *sbatch_args,
        str(REPO / "scripts" / script),
        str(config),
        env={"MASTER_PORT": str(free_port()), "OLMO_TRAIN_TEST_SAVE_PAUSE": SAVE_PAUSE, **(env or {})},
    )


def wait_mid_run(run: Path, job: str, slurm: SlurmCluster) -> None:
    """Until rank 0 is inside the step-2 checkpoint write, with steps 3..6 still to come."""
    deadline = time.time() + 180
    while not (run / "step2.saving").exists():
        assert (info := slurm.job(job))["JobState"] in ("PENDING", "RUNNING"), slurm.describe(info)
        assert time.time() < deadline, "the job never reached its step-2 checkpoint"
        time.sleep(0.1)


def check_resumed_like_uninterrupted(reference: Path, run: Path, output: str) -> None:
    ref, got = metrics(reference / "run"), metrics(run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), f"each step exactly once\n{output}"
    for a, b in zip(ref, got, strict=True):
        assert a["train/loss"] == b["train/loss"], f"step {a['step']}"
        assert a["train/batch_fingerprint"] == b["train/batch_fingerprint"]
        assert b["train/tokens_seen"] == a["train/tokens_seen"] == b["step"] * GBS * SEQ
    preempted = [line for line in output.splitlines() if "preempted at step" in line]
    assert len(preempted) == 1 and int(preempted[0].split("at step ")[1].split(",")[0]) < STEPS, output
    assert f"finished at step {STEPS}" in output


@pytest.mark.slow
@pytest.mark.parametrize("how", ["usr1", "usr1-full", "preempted"])
def test_slurm_train_saves_requeues_and_resumes(how: str, slurm: SlurmCluster, reference: Path, tmp_path: Path) -> None:
    """usr1: `scancel --signal=USR1` (what --signal=USR1@120 sends before the time limit) reaches the tasks;
    usr1-full: the batch script gets it too (it used to die of it: FAILED, never requeued);
    preempted: a job of a higher-priority partition needs the node (PreemptMode=REQUEUE: SIGTERM, then Slurm
    requeues the job itself)."""
    job = submit(slurm, tmp_path, reference, "slurm_train.sh", "--ntasks-per-node=2", "--nodes=1")
    wait_mid_run(tmp_path / "run", job, slurm)
    if how == "usr1":
        slurm.run("scancel", "--signal=USR1", job)
    elif how == "usr1-full":
        slurm.run("scancel", "--signal=USR1", "--full", job)
    else:
        node = slurm.job(job)["NodeList"]
        slurm.sbatch("--partition=urgent", f"--nodelist={node}", "--exclusive", "--wrap=true", "--output=/dev/null")
    slurm.wait_requeued_and_release(job)
    info = slurm.wait(job, "COMPLETED")
    output = (tmp_path / f"job-{job}.out").read_text()
    assert info["Restarts"] == "1", output
    if how == "usr1":  # the tasks only
        assert "slurm_train.sh: SIGUSR1 received" not in output, output
    else:  # the batch script got the signal, said so, and lived on to see the save through
        signal = "SIGUSR1" if how == "usr1-full" else "SIGTERM"
        assert f"slurm_train.sh: {signal} received" in output, output
    check_resumed_like_uninterrupted(reference, tmp_path / "run", output)


@pytest.mark.slow
def test_slurm_torchrun_on_two_nodes_saves_requeues_and_resumes(
    slurm: SlurmCluster, reference: Path, tmp_path: Path
) -> None:
    """One torchrun per node (`srun --ntasks-per-node=1 torchrun --nnodes=2 ... --rdzv-backend=c10d`), one process
    each: the same run as one launcher with 2 processes, also across a `scancel --signal=USR1` (which torchrun
    passes on to its process) and the requeue."""
    job = submit(slurm, tmp_path, reference, "slurm_torchrun.sh", "--nodes=2", env={"NPROC_PER_NODE": "1"})
    wait_mid_run(tmp_path / "run", job, slurm)
    slurm.run("scancel", "--signal=USR1", job)
    slurm.wait_requeued_and_release(job)
    info = slurm.wait(job, "COMPLETED")
    output = (tmp_path / f"job-{job}.out").read_text()
    assert info["Restarts"] == "1" and info["NodeList"] == "n[1-2]", output
    assert "world size 2" in output, output
    check_resumed_like_uninterrupted(reference, tmp_path / "run", output)
