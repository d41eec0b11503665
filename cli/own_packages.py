"""Stop at once, with one line, when the `olmo_data` that Python imports is not this project's.

OLMo's distribution (`ai2-olmo`) ships a top-level package that is also named `olmo_data` (its data files).
Installed in the same environment it shadows ours, and every command would die on an ImportError that names
neither package nor the way out. This module imports nothing of ours, so it can run before anything that would
fail, and it looks at the installed distributions only when something is wrong (that scan costs ~0.1 s).
"""

from __future__ import annotations

import importlib
import sys

MARK = "olmo-data"  # olmo_data.TOOLKIT in this project's package


def foreign_olmo_data() -> str | None:
    """None when `import olmo_data` gives this project's package; else what to tell the user."""
    try:
        module = importlib.import_module("olmo_data")
    except ImportError as e:  # a package of that name that fails to import is not ours either
        where, error = "", f" ({type(e).__name__}: {e})"
    else:
        if getattr(module, "TOOLKIT", None) == MARK:
            return None
        where, error = str(getattr(module, "__file__", None) or list(getattr(module, "__path__", []))), ""
    owners = _distributions_providing("olmo_data")
    foreign = [d for d in owners if d.lower().replace("_", "-") != MARK] or ["an unknown distribution"]
    return (
        f"the olmo_data package Python imports{' (' + where + ')' if where else ''} is not this project's: it "
        f"comes from {', '.join(foreign)}{error}. OLMo's ai2-olmo ships a package of that name; install this "
        "project in an environment of its own: python3 -m venv .venv && .venv/bin/pip install -e ."
    )


def _distributions_providing(package: str) -> list[str]:
    from importlib.metadata import packages_distributions

    return sorted(set(packages_distributions().get(package, [])))


def exit_if_shadowed() -> None:
    """The commands' first step: on a clash, the message and exit status 2 (bad set-up), no traceback."""
    message = foreign_olmo_data()
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
