"""Installed beside OLMo (`ai2-olmo` ships a top-level `olmo_data` too), the commands stop with one line that names
the clash and the way out; and this project installs no top-level package named `cli`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def fake_olmo(site: Path) -> None:
    """A distribution `ai2-olmo` whose top-level `olmo_data` holds only data files, as OLMo's does."""
    (site / "olmo_data").mkdir(parents=True)
    (site / "olmo_data" / "__init__.py").write_text("")
    info = site / "ai2_olmo-0.6.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ai2-olmo\nVersion: 0.6.0\n")
    (info / "top_level.txt").write_text("olmo\nolmo_data\n")
    (info / "RECORD").write_text("olmo_data/__init__.py,,\nai2_olmo-0.6.0.dist-info/METADATA,,\n")


@pytest.mark.parametrize("command", [["olmo-data", "stats", "--help"], ["olmo-train", "--help"]])
def test_a_shadowing_olmo_data_is_named_with_the_way_out(tmp_path: Path, command: list[str]) -> None:
    site = tmp_path / "site"
    fake_olmo(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([str(BIN / command[0]), *command[1:]], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: the olmo_data package Python imports ({site / 'olmo_data'}")
    assert "it comes from ai2-olmo" in lines[0] and "python3 -m venv" in lines[0]


def test_without_a_clash_the_commands_start(tmp_path: Path) -> None:
    proc = subprocess.run([str(BIN / "olmo-data"), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "Usage: olmo-data" in proc.stdout, proc.stderr


def test_no_top_level_cli_package_is_installed(tmp_path: Path) -> None:
    """From outside the checkout, `cli` is not importable; the commands' package is `olmo_cli`."""
    code = (
        "import importlib.util, importlib.metadata as m; "
        "top = m.distribution('olmo-data').read_text('top_level.txt'); "
        "print(importlib.util.find_spec('cli') is None, sorted(top.split()))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "True ['olmo_cli', 'olmo_data', 'olmo_train', 'olmo_view']"
