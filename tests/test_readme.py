"""Every README code block runs as written, in order, the way a newcomer would paste them after the set-up commands.

The shell and Python blocks are taken from README.md and run one after another in a fresh working directory
(holding the repository's `configs/` and `notebooks/`), so a renamed option, a missing step or an undefined name
in a snippet fails here. A block that cannot run on a CPU-only machine without a network says so just above its fence:
`<!-- readme-test: skip: REASON -->`; the reason is part of the README, so the reader knows it too.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None  # the reason, for a block that is not run


def readme_blocks(text: str) -> list[Block]:
    """The bash and python blocks of a Markdown text, each with the skip reason written above it, if any."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if language in ("bash", "python"):
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            reason = SKIP.match(before.strip())
            code = "\n".join(lines[start + 1 : end]) + "\n"
            blocks.append(Block(start + 1, language, code, reason.group(1) if reason else None))
        i = end + 1
    return blocks


def test_every_block_runs_or_says_why_not() -> None:
    """The parser finds the README's blocks, and each skipped one gives a reason a reader can act on."""
    blocks = readme_blocks((ROOT / "README.md").read_text())
    runnable = [b for b in blocks if b.skip is None]
    assert len(runnable) >= 15, [b.line for b in runnable]
    assert {b.language for b in runnable} == {"bash", "python"}
    for b in blocks:
        if b.skip is not None:
            assert re.search(r"GPU|network|download|set-up|test suite|Slurm", b.skip), (b.line, b.skip)
    # no runnable block points at data only its author has
    for b in runnable:
        assert "../shared" not in b.code and "example.org" not in b.code, b.line


def test_parser_reads_markers_and_fences() -> None:
    text = "intro\n\n<!-- readme-test: skip: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n```\nout\n```\n"
    text += "```python\nprint(1)\n```\n"
    blocks = readme_blocks(text)
    assert [(b.line, b.language, b.skip, b.code) for b in blocks] == [
        (4, "bash", "needs a GPU", "nvidia-smi\n"),
        (11, "python", None, "print(1)\n"),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_readme_blocks_run_in_order(tmp_path: Path) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")  # copied: the notebook finds its root from there
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "OLMO_DATA_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PET_MASTER_PORT": str(free_port()),  # torchrun's --master-port, so that a busy 29500 does not matter
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for block in readme_blocks((ROOT / "README.md").read_text()):
        if block.skip is not None:
            continue
        if block.language == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", block.code]
        else:
            cmd = [sys.executable, "-c", block.code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=900)
        output = (proc.stdout + proc.stderr)[-4000:]
        assert proc.returncode == 0, f"README.md:{block.line} ({block.language}) failed:\n{block.code}\n{output}"
        assert "Traceback" not in proc.stderr, f"README.md:{block.line}:\n{output}"
