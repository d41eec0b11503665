"""Every code block of the README and of docs/ runs as written, in order, the way a newcomer would paste them.

The shell and Python blocks are taken from README.md, then from the docs/ pages in the order PAGES lists them, and
run one after another in one fresh working directory (holding the repository's `configs/` and `notebooks/`), so a
later page uses what earlier blocks made, and a renamed option, a missing step or an undefined name in a snippet
fails here. A block that cannot run on a CPU-only machine without a network says so just above its fence:
`<!-- readme-test: skip: REASON -->`; the reason is part of the page, so the reader knows it too. Every block that
runs must show something: an empty output, a no-op ("nothing to train"), or an empty search result that its output
does not explain ("0 found", "0 places in 0 steps" without a line saying why) fails, as does a third-party warning.
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
# The pages whose blocks run, in the order they run: the README's quick start makes runs/demo and runs/tiny, which
# every page after it reads; training.md's fine-tune data feeds its anneals; olmo-compatibility.md comes last.
PAGES = [
    "README.md",
    "docs/data.md",
    "docs/inspect-and-trace.md",
    "docs/training.md",
    "docs/checkpoints-and-models.md",
    "docs/olmo-compatibility.md",
    "docs/testing-and-guarantees.md",
    "docs/benchmarks.md",
]
README_MAX_LINES = 250
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


def page_blocks() -> list[tuple[str, Block]]:
    """Every page's blocks, in the order they run."""
    return [(page, b) for page in PAGES for b in readme_blocks((ROOT / page).read_text())]


def test_every_block_runs_or_says_why_not() -> None:
    """The parser finds the blocks of every page, and each skipped one gives a reason a reader can act on."""
    assert sorted(PAGES[1:]) == sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")), "a page not run"
    blocks = page_blocks()
    runnable = [(page, b) for page, b in blocks if b.skip is None]
    readme_runnable = [b for page, b in runnable if page == "README.md"]
    # the README is a guide with a block per stage; the reference pages hold most blocks
    assert len(readme_runnable) >= 10, [b.line for b in readme_runnable]
    assert len(runnable) >= 40, [(page, b.line) for page, b in runnable]
    assert {b.language for _, b in runnable} == {"bash", "python"}
    for page, b in blocks:
        if b.skip is not None:
            assert re.search(r"GPU|network|download|set-up|test suite|Slurm", b.skip), (page, b.line, b.skip)
    # no runnable block points at data only its author has
    for page, b in runnable:
        assert "../shared" not in b.code and "example.org" not in b.code, (page, b.line)


def test_readme_is_a_guide() -> None:
    """The README fits in README_MAX_LINES, links every docs/ page, and every command has a heading somewhere."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for page in PAGES[1:]:
        assert f"]({page})" in readme, page
    from olmo_cli.main import COMMANDS
    from olmo_cli.train_main import TRAIN_COMMANDS

    headings = [
        line
        for page in PAGES
        for line in (ROOT / page).read_text().splitlines()
        if line.startswith("#") and not line.startswith("#!")
    ]
    for tool, commands in (("olmo-data", COMMANDS), ("olmo-train", TRAIN_COMMANDS)):
        for name in commands:
            assert any(f"`{tool} {name}`" in h for h in headings), f"no heading for {tool} {name}"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve() -> None:
    """Every link from a page to a page of PAGES (and to a heading of it) finds its target."""
    targets: dict[str, set[str]] = {}
    for page in PAGES:
        lines, fenced = [], False
        for line in (ROOT / page).read_text().splitlines():
            fenced ^= line.startswith("```")
            if not fenced and line.startswith("#"):
                lines.append(anchor(line))
        targets[page] = set(lines)
    for page in PAGES:
        here = Path(page).parent
        for link in re.findall(r"\]\(([^)\s]+)\)", (ROOT / page).read_text()):
            if link.startswith(("http", "mailto:")) or link.endswith((".png", ".py", ".sh")):
                continue
            path, _, frag = link.partition("#")
            target = os.path.normpath(here / path) if path else page
            if not target.endswith(".md"):
                continue
            assert (ROOT / target).exists(), (page, link)
            if frag and target in targets:
                assert frag in targets[target], (page, link)


# An output that shows nothing, and says so only by a count of zero; such a line must be followed by one saying why
EMPTY = re.compile(r"nothing to train|\b0 found\b|\b0 places in 0 steps\b|\b0 span\(s\)|\b0 targets traced\b")
EXPLAINED = re.compile(r"^\s*\(no |nothing marked|\bbecause\b")
WARNING = re.compile(r"\b\w*Warning: |^\s*warnings\.warn\(|\bINFO \w[\w.]*:|^\[\w+\] WARNING \| ")


def shows_nothing(output: str) -> str | None:
    """Why an output shows nothing a reader can use, or None when it shows something."""
    if not output.strip():
        return "it prints nothing"
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "nothing to train" in line:
            return f"a no-op: {line.strip()!r}"
        if EMPTY.search(line) and not (i + 1 < len(lines) and EXPLAINED.search(lines[i + 1])):
            return f"an empty result it does not explain: {line.strip()!r}"
        if WARNING.search(line):
            return f"a third-party warning or log echo: {line.strip()!r}"
    return None


def test_shows_nothing_flags_empty_outputs() -> None:
    assert shows_nothing("") == "it prints nothing"
    assert shows_nothing("x | nothing to train: the run is at step 100, and ...") is not None
    assert shows_nothing("runs/tiny: 100 steps of train/loss; ...: 0 found\n") is not None
    assert shows_nothing("runs/tiny: 100 steps of train/loss; ...: 7 found\nstep 23: ...") is None
    zero = "0 targets traced through steps 1..20 (...): 0 places in 0 steps\n"
    assert shows_nothing(zero) is not None
    assert shows_nothing(zero + "(no target is in this run's own data; the stages it grew from follow)\n") is None
    assert shows_nothing("/x/y.py:3: UserWarning: something\n") is not None
    assert shows_nothing("[IPKernelApp] WARNING | Kernel is running over TCP without encryption.\n") is not None
    assert shows_nothing("0 span(s) of at least 8 tokens of the text ...\n") is not None


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
    for page, block in page_blocks():
        if block.skip is not None:
            continue
        if block.language == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", block.code]
        else:
            cmd = [sys.executable, "-c", block.code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=900)
        output = proc.stdout + proc.stderr
        where = f"{page}:{block.line} ({block.language})"
        assert proc.returncode == 0, f"{where} failed:\n{block.code}\n{output[-4000:]}"
        assert "Traceback" not in proc.stderr, f"{where}:\n{output[-4000:]}"
        why = shows_nothing(output)
        assert why is None, f"{where} shows nothing: {why}\n{block.code}\n{output[-4000:]}"
