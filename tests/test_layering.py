"""olmo_data must import and work without torch and without click (DESIGN.md: data jobs need only numpy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODULES = [p.stem for p in (Path(__file__).parents[1] / "olmo_data").glob("*.py") if p.stem != "__init__"]


def test_olmo_data_imports_without_torch_and_click() -> None:
    code = (
        "import sys\n"
        "for blocked in ('torch', 'click', 'wandb'):\n"
        "    sys.modules[blocked] = None  # any import of them raises ImportError\n"
        f"for name in {MODULES!r}:\n"
        "    __import__('olmo_data.' + name)\n"
        "print('ok', len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
    assert len(MODULES) >= 10
