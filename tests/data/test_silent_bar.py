"""A progress bar that would draw nothing (not a terminal, or turned off) costs a fresh command no tqdm import."""

from __future__ import annotations

import subprocess
import sys


def test_a_bar_off_the_terminal_imports_no_tqdm_and_still_iterates() -> None:
    code = (
        "import sys\n"
        "from olmo_data.display import progress_bar\n"
        "with progress_bar(range(3), desc='x', total=3) as bar:\n"
        "    items = list(bar)\n"
        "    bar.update(2); bar.set_postfix(a=1)\n"
        "assert items == [0, 1, 2] and bar.n == 0, items\n"
        "assert 'tqdm' not in sys.modules\n"
        "with progress_bar(desc='y', total=3, progress=True) as bar:\n"
        "    bar.update(3)\n"
        "assert 'tqdm' in sys.modules\n"
    )
    env = {"PATH": "/usr/bin:/bin", "OLMO_PROGRESS": "", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "y: 100%" in done.stderr and "x:" not in done.stderr
