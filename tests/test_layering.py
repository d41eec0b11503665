"""olmo_data must import and work without torch and without click (DESIGN.md: data jobs need only numpy), and its
modules must depend on each other one way only (DESIGN.md: the layering test fails on any import circle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {_module_name(p): p for p in sorted((ROOT / "olmo_data").rglob("*.py"))}
MODULES = [name.removeprefix("olmo_data.") for name in SOURCES if name != "olmo_data"]


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


def _imports(name: str) -> set[str]:
    """The olmo_data modules `name` imports anywhere in its file: at the top, inside functions (an import moved
    into a function to dodge a circle still ties the two modules together) or for type checking only."""
    out = set()
    for node in ast.walk(ast.parse(SOURCES[name].read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from olmo_data import chat`
    return {m for m in out if m in SOURCES and m != name}


def test_olmo_data_has_no_import_circle() -> None:
    graph = {name: _imports(name) for name in SOURCES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
