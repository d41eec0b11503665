"""Values as OLMo's loader (OmegaConf over a dataclass schema) reads them: `${a.b}` interpolations resolved, and
numbers that YAML 1.1 leaves as strings (`1e-5`, `5e12`) made numbers where the field is numeric.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any

from olmo_data.config.schema import ConfigError
from olmo_data.errors import shown

_REFERENCE = re.compile(r"\$\{([^{}]*)\}")


def resolve_interpolations(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with OmegaConf's `${key}` and `${a.b}` replaced by the values they name, as OLMo's loader does. A
    reference that is a whole value takes that value (an int stays an int); one inside a string is replaced by
    its text. A cycle is refused naming its keys; resolvers (`${oc.env:X}`, OLMo's `${path.glob:...}`) and
    relative references are refused too: write the value out."""
    return _resolve(raw, "", (), raw)


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _resolve(node: Any, where: str, chain: tuple[str, ...], root: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {k: _resolve(v, _join(where, k), chain, root) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, _join(where, i), chain, root) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node
    chain = (*chain, where)
    whole = _REFERENCE.fullmatch(node)
    if whole:
        return _target(whole[1], where, chain, root)
    return _REFERENCE.sub(lambda m: _text(_target(m[1], where, chain, root), where), node)


def _target(path: str, where: str, chain: tuple[str, ...], root: dict[str, Any]) -> Any:
    if not path or ":" in path or path.startswith("."):
        raise ConfigError(
            f"config key {where!r}: ${{{path}}} is an OmegaConf resolver or relative reference; only references "
            "to other keys (${a.b}) are resolved here: write the value out"
        )
    if any(c == path or c.startswith(path + ".") for c in chain):  # the key itself, or a section holding it
        raise ConfigError(f"config key {chain[0]!r}: interpolation cycle {' -> '.join((*chain, path))}")
    node: Any = root
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(f"config key {where!r}: ${{{path}}} names no key of the config")
    return _resolve(node, path, chain, root)


def _text(value: Any, where: str) -> str:
    if isinstance(value, (dict, list)):
        raise ConfigError(f"config key {where!r}: a reference inside a string names a section or list: {shown(value)}")
    return str(value)


# ---- numbers as YAML 1.1 reads them ----------------------------------------------------------------------------


def to_numbers(cls: Any, raw: dict[str, Any]) -> None:
    """Numbers PyYAML leaves as strings (`1e-5`, `5e12`: YAML 1.1 wants a dot and a signed exponent) made numbers
    where our field is numeric, in place; anything else is left for the builder to refuse by key."""
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        if key in hints:
            raw[key] = _number(hints[key], value)


def _number(tp: Any, value: Any) -> Any:
    options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(value, dict):
            to_numbers(option, value)
            return value
        if typing.get_origin(option) is list and isinstance(value, list):
            return [_number(typing.get_args(option)[0], v) for v in value]
    if isinstance(value, str) and str not in options and (int in options or float in options):
        try:
            number = float(value)
        except ValueError:
            return value
        if float in options:
            return number
        if number.is_integer():
            return int(number)
    return value
