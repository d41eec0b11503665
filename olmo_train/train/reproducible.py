"""Same config, same machine, same numbers: the process-wide settings that make an uninterrupted run a fixed point.

"Bitwise resume" only means something if the run it is compared with is itself reproducible. On CPU the numbers
of a float reduction depend on how many threads split it, so the trainer fixes the thread count of each process
itself (`OMP_NUM_THREADS` if set, else the CPUs the process may run on shared among the node's processes) rather
than leaving it to whatever the libraries decide, and asks the BLAS and OpenMP runtimes not to change a team's
size on their own (`MKL_DYNAMIC`, `OMP_DYNAMIC`: set before torch loads, by `olmo_train.__main__`).

GPU kernels are another matter: cuBLAS split-K reductions and atomics in attention backward differ run to run.
`deterministic: true` asks for deterministic kernels everywhere (a fixed cuBLAS workspace, torch's deterministic
algorithms, flash-attn's deterministic backward) at some cost in speed; a kernel with no deterministic version
then stops the run with torch's error naming it, rather than quietly differing.
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"  # the workspace setting cuBLAS needs for deterministic results (CUDA >= 10.2)


def cpu_threads(local_world_size: int) -> int:
    """The intra-op threads one process uses: `OMP_NUM_THREADS` when set, else the CPUs this process may run on
    (its affinity, which Slurm and containers narrow) divided among the processes of this node, at least 1."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, local_world_size))


def make_reproducible(deterministic: bool) -> int:
    """Fix this process's thread count (returned: the start line reports it) and, with `deterministic`, select
    deterministic GPU kernels. Called before the model is built, so the first matmul already runs under these."""
    threads = cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if torch.get_num_threads() != threads:  # a second run in one process (a test, a notebook) keeps its pool
        torch.set_num_threads(threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic)  # as configured, also when an earlier run in this process
    torch.backends.cudnn.deterministic = deterministic  # (a test, a notebook) set it otherwise
    return threads
