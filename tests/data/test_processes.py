"""Worker pools fork only in a process without a threaded runtime: a fork of a process that loaded torch copies
its OpenMP runtime's state without its threads (the CI run this guards against crashed in exactly that case)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch  # noqa: F401 - loaded, as in a notebook or generate --trace

from olmo_data.processes import pool_context

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_that_loaded_torch_spawns_its_workers() -> None:
    assert pool_context().get_start_method() == "spawn"


def test_an_olmo_data_command_process_forks_them() -> None:
    code = "import sys; from olmo_data.processes import pool_context; print(pool_context().get_start_method())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "fork"
    torch_free = "import sys, olmo_data.suffix_index.index, olmo_data.trace.find; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", torch_free], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # the commands' own modules do not load it
