"""Every config key with its default and what it does, for `python -m olmo_train --keys`.

The table is read from the config dataclasses themselves (names, defaults, nested sections) and from the comment
beside each field in olmo_data/config/schema.py, so it cannot drift from what the trainer accepts.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import yaml

from olmo_data.config.schema import CHOICES, TrainConfig

_FIELD = re.compile(r"^\s+(\w+):[^#]*?(?:#\s*(.*))?$")


def _comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line in the class body (empty when it has none)."""
    out: dict[str, str] = {}
    for line in inspect.getsource(cls).splitlines()[1:]:
        m = _FIELD.match(line)
        if m and m.group(1) not in out:
            out[m.group(1)] = (m.group(2) or "").strip()
    return out


def key_table(instance: Any = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML, description) for every leaf key, sections in declaration order."""
    instance = TrainConfig() if instance is None else instance
    comments = _comments(type(instance))
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        key = prefix + f.name
        if dataclasses.is_dataclass(value):
            rows += key_table(value, key + ".")
            continue
        text = comments.get(f.name, "")
        if key in CHOICES and not all(c in text for c in CHOICES[key]):
            text = f"{text}; one of {' | '.join(CHOICES[key])}".lstrip("; ")
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        rows.append((key, shown, text))
    return rows


def keys_text() -> str:
    rows = key_table()
    width = max(len(k) + len(v) for k, v, _ in rows) + 3
    return "\n".join(f"{f'{k} = {v}':<{width}}  {d}".rstrip() for k, v, d in rows)
