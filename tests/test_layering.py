"""The layout rules of ARCHITECTURE.md, checked on the source: no import circle, olmo_data free of torch and click,
the checkpoint package free of the LoRA/ReLoRA code and of the loop, small files, one module naming the files of a
checkpoint, and no private name imported from another module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "olmo_data": "olmo_data",
    "olmo_train": "olmo_train",
    "olmo_view": "olmo_view",
    "olmo_cli": "cli",
}  # name: folder
MAX_LINES = 600
CHECKPOINT_NAMES = {
    "trainer_state.json",
    "checksums.json",
    "config.yaml",
    "model.pt",
    "optim.pt",
    "relora.pt",
    ".metadata",
    "latest",
    "latest-unsharded",
    "rng",
    "metrics.jsonl",
    "writer.lock",
}
# the one module that spells them, and the import of OLMo's own checkpoints (OLMo's files share two of the names)
NAMES_ALLOWED_IN = {"olmo_data.run.layout", "olmo_train.convert.olmo_native"}


def modules() -> dict[str, Path]:
    """Every module of the three packages by its import name (a package by its own name: its `__init__.py`)."""
    out = {}
    for name, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations only, never run."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports(module: str) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import the module runs, at its top or inside a
    function: an import inside a function closes a circle as surely as one at the top, only later."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # `from package import submodule`
                    yield sub, [], node.lineno
                else:
                    yield base, [alias.name], node.lineno


def graph() -> dict[str, set[str]]:
    return {m: {target for target, _, _ in imports(m) if target in MODULES and target != m} for m in MODULES}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:  # (restored: a raised limit changed what later tests' JSON readers accept)
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circle() -> None:
    edges = graph()
    assert len(edges) > 60
    found = circles(edges)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle() -> None:
    """The check above can fail: a made-up circle of three modules is found, and a chain is not one."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_olmo_data_never_imports_torch_click_or_the_trainer() -> None:
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: imports {target}"
        for m in MODULES
        if m.startswith("olmo_data")
        for target, _, line in imports(m)
        if target.split(".")[0] in ("torch", "click", "wandb", "olmo_train", "olmo_cli")
    ]
    assert not bad, bad


def test_olmo_data_imports_without_torch_and_click() -> None:
    """At run time too (an optional import through a library would pass the static check above)."""
    names = [m for m in MODULES if m.startswith("olmo_data")]
    code = (
        "import sys\n"
        "for blocked in ('torch', 'click', 'wandb'):\n"
        "    sys.modules[blocked] = None  # any import of them raises ImportError\n"
        f"for name in {names!r}:\n"
        "    __import__(name)\n"
        "print('ok', len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
    assert len(names) >= 10


def test_the_view_stands_above_the_data_library_alone() -> None:
    """The web view asks the data library, through its one module `olmo_view.answers` (so a move inside olmo_data
    is fixed in one place), and never the trainer, torch or click; nothing below imports the view."""
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: imports {target}"
        for m in MODULES
        if m.startswith("olmo_view")
        for target, _, line in imports(m)
        if target.split(".")[0] in ("torch", "click", "wandb", "olmo_train", "olmo_cli")
        or (target.startswith("olmo_data") and m != "olmo_view.answers")
    ]
    bad += [
        f"{MODULES[m].relative_to(ROOT)}:{line}: imports {target}"
        for m in MODULES
        if m.startswith(("olmo_data", "olmo_train"))
        for target, _, line in imports(m)
        if target.startswith("olmo_view")
    ]
    assert not bad, bad
    r = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None; import olmo_view.server, olmo_view.plot"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr


def test_the_checkpoint_package_knows_nothing_of_adapters_or_the_loop() -> None:
    """Adapters are ordinary parameters to it: ReLoRA brings its own split and load hooks."""
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: imports {target}"
        for m in MODULES
        if m.startswith("olmo_train.checkpoint")
        for target, _, line in imports(m)
        if target.startswith(("olmo_train.nn", "olmo_train.train", "olmo_train.convert", "olmo_train.generate"))
    ]
    assert not bad, bad


def test_no_private_name_from_another_module() -> None:
    """Names used across modules are public: a leading underscore means "this module's own"."""
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: {target}.{name}"
        for m in MODULES
        for target, names, line in imports(m)
        for name in names
        if name.startswith("_") and target.split(".")[0] in PACKAGES and name != "__version__"
    ]
    assert not bad, bad


def _declared_all(package: str) -> set[str] | None:
    """The names a package's `__init__` lists in `__all__` (None: it has no `__all__`)."""
    for node in ast.parse(MODULES[package].read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if getattr(target, "id", None) == "__all__" and getattr(node, "value", None) is not None:
            return set(ast.literal_eval(node.value))  # type: ignore[arg-type]
    return None


def test_other_packages_are_reached_through_their_api() -> None:
    """From outside a subpackage, a module imports what its `__init__` lists (a name, or a submodule it lists
    as part of its API, like `nn.lora`), so a move inside the subpackage does not ripple."""
    bad = []
    for m in MODULES:
        for target, _, line in imports(m):
            package = target.rpartition(".")[0]
            if package.count(".") < 1 or package not in MODULES or m == package or m.startswith(package + "."):
                continue  # a top-level package's own modules, or a sibling inside the same subpackage
            if target.rpartition(".")[2] not in (_declared_all(package) or set()):
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line}: imports {target}, not through {package}")
    assert not bad, bad


@pytest.mark.parametrize("folder", sorted(set(PACKAGES.values())))
def test_no_source_file_over_600_lines(folder: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_data_library_holds_few_modules_directly() -> None:
    """olmo_data is packages by concept (ARCHITECTURE.md): the flat folder keeps the plumbing every package uses."""
    direct = sorted(p.name for p in (ROOT / "olmo_data").glob("*.py"))
    assert len(direct) <= 10, direct
    assert {p.name for p in (ROOT / "olmo_data").iterdir() if p.is_dir() and (p / "__init__.py").is_file()} >= {
        "config",
        "dataset",
        "run",
        "trace",
        "suffix_index",
    }


def test_the_trainer_package_holds_few_modules_directly() -> None:
    direct = sorted(p.name for p in (ROOT / "olmo_train").glob("*.py"))
    assert len(direct) <= 10, direct
    assert {p.name for p in (ROOT / "olmo_train").iterdir() if p.is_dir() and (p / "__init__.py").is_file()} >= {
        "nn",
        "train",
        "checkpoint",
        "convert",
    }


def _strings(tree: ast.Module) -> Iterator[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_checkpoint_file_names_are_spelled_in_one_module() -> None:
    spelled = {
        f"{MODULES[m].relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for m in MODULES
        if m not in NAMES_ALLOWED_IN
        for node in _strings(ast.parse(MODULES[m].read_text()))
        if node.value in CHECKPOINT_NAMES or node.value.startswith("rng/")
    }
    assert not spelled, sorted(spelled)
    layout = {n.value for n in _strings(ast.parse(MODULES["olmo_data.run.layout"].read_text()))}
    assert CHECKPOINT_NAMES <= layout


@pytest.mark.parametrize("package", [m for m in MODULES if MODULES[m].name == "__init__.py"])
def test_each_package_states_its_api(package: str) -> None:
    """`__all__` lists the package's public names, and each one is there to import."""
    assert _declared_all(package) is not None, f"{MODULES[package].relative_to(ROOT)}: no __all__"
    if package.startswith("olmo_cli"):
        return  # the click entry point: importing it checks for a foreign olmo_data first
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import {package} as p; missing = [n for n in p.__all__ if not hasattr(p, n)]; print(missing)",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_every_package_folder_is_in_the_distribution() -> None:
    """pyproject.toml lists the packages by name: a new subpackage missing there works in an editable install and
    is absent from a wheel."""
    block = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert block, "pyproject.toml: no packages = [...] list"
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    folders = {m for m in MODULES if MODULES[m].name == "__init__.py"}
    assert folders == listed, (sorted(folders - listed), sorted(listed - folders))


# -- one reader of a run (issue 42): no module outside the per-trainer implementations asks which trainer made a run
TRAINER_QUESTIONS = {"olmo_core_form", "is_olmo_core_form", "olmo_core_of", "open_trained_on", "is_olmo_core_config"}
# where the question may be asked: the config reader (a config's form and its data.olmo_core key), OLMo-core's own
# package, the chooser of the run reader and its OLMo-core implementation, the trainer's chooser and its OLMo-core
# reader; the instance index's one-line refusal of data.olmo_core for commands that read only data.paths/mix; and
# the model converters, which read OLMo-core's checkpoints (models, not runs' data)
TRAINER_ASKED_IN = (
    "olmo_data.config",
    "olmo_data.olmo_core",
    "olmo_data.run.open",
    "olmo_data.run.reader_olmo_core",
    "olmo_data.dataset.instances",
    "olmo_train.train.readers",
    "olmo_train.train.olmo_core_data",
    "olmo_train.convert",
    "olmo_cli.import_olmo_core",
)


def trainer_questions(source: str) -> list[tuple[int, str]]:
    """Where a module asks which trainer made a run: imports OLMo-core's data package or a function that tells an
    OLMo-core config apart, calls one, or reads the `olmo_core` key of a config (`cfg.data.olmo_core`,
    `data["olmo_core"]`, `data.get("olmo_core")`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("olmo_data.olmo_core"):
                out.append((node.lineno, f"from {node.module} import ..."))
            out += [(node.lineno, f"imports {a.name}") for a in node.names if a.name in TRAINER_QUESTIONS]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("olmo_data.olmo_core")]
        elif isinstance(node, ast.Attribute) and node.attr in TRAINER_QUESTIONS | {"olmo_core"}:
            out.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Constant) and node.value == "olmo_core":
            out.append((node.lineno, "'olmo_core'"))
    return out


def test_no_module_outside_the_run_readers_asks_which_trainer_made_a_run() -> None:
    asked = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: {what}"
        for m in MODULES
        if not any(m == a or m.startswith(a + ".") for a in TRAINER_ASKED_IN)
        for line, what in trainer_questions(MODULES[m].read_text())
    ]
    assert not asked, (
        "read a run through olmo_data.run.read_run (RunData) instead of asking which trainer made it:\n"
        + "\n".join(asked)
    )


@pytest.mark.parametrize(
    "planted",
    [
        "from olmo_data.config import olmo_core_form\n",
        "import olmo_data.olmo_core.runs\n",
        "def f(cfg):\n    return cfg.data.olmo_core\n",
        "def f(raw):\n    return raw.get('olmo_core')\n",
    ],
)
def test_the_trainer_question_finder_finds_a_planted_branch(planted: str) -> None:
    assert trainer_questions(planted)
    assert not trainer_questions("from olmo_data.run import read_run\nrun = read_run('c.yaml')\n")
