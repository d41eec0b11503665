"""The same config on the same machine logs the same numbers in every fresh process, whatever the load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from olmo_train.train.reproducible import cpu_threads, make_reproducible
from tests.train.test_train_e2e import REPO, metrics, tiny_config, write_tokens

TIMING = ("throughput/", "data/wait_s", "system/")  # how fast, not what was computed


@pytest.mark.slow
def test_five_fresh_runs_log_identical_numbers(tmp_path: Path) -> None:
    """Five runs started at once (so they compete for the cores, as runs on a shared machine do), each with the
    thread count the trainer chooses: every logged number but the timings is identical in all five."""
    data = write_tokens(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC")}
    model = {"d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 256, "max_sequence_length": 32}
    runs = []
    for k in range(5):
        folder = tmp_path / f"run{k}"
        folder.mkdir()
        config = tiny_config(folder, data, model=model, save_interval=100, console_log_interval=1)
        cmd = [sys.executable, "-m", "olmo_train", str(config), "--max_duration=8"]
        runs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    for proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert "intra-op thread" in out, out  # the start line says how many

    def numbers(k: int) -> list[dict[str, object]]:
        lines = metrics(tmp_path / f"run{k}" / "run")
        return [{key: v for key, v in line.items() if not key.startswith(TIMING)} for line in lines]

    first = numbers(0)
    assert [line["step"] for line in first] == list(range(1, 9))
    assert {"train/loss", "optim/grad_norm", "train/batch_fingerprint"} <= set(first[0])
    for k in range(1, 5):
        assert numbers(k) == first, f"run {k} differs from run 0"


def test_the_thread_count_is_chosen_and_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert cpu_threads(8) == 3  # as the user (or torchrun) says
        monkeypatch.delenv("OMP_NUM_THREADS")
        cpus = len(os.sched_getaffinity(0))
        assert cpu_threads(1) == cpus and cpu_threads(cpus * 4) == 1  # shared among the node's processes
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert make_reproducible(False) == cpus and torch.get_num_threads() == cpus
    finally:
        torch.set_num_threads(before)
