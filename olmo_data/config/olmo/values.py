"""Values as OLMo's loader (OmegaConf over a dataclass schema) reads them: `${a.b}` interpolations resolved, and
numbers that YAML 1.1 leaves as strings (`1e-5`, `5e12`) made numbers where the field is numeric.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import types
import typing
from typing import Any

from olmo_data.config.schema import ConfigError
from olmo_data.errors import shown

MAX_RESOLVED = 1_000_000  # characters of one resolved value (a section or list: its strings', and 16 per entry)
MAX_TOTAL = 64 * MAX_RESOLVED  # ... and of the whole config
_ENTRY = 16  # an entry of a section or list costs more than a character to hold and to copy
MAX_DEPTH = 100  # references followed one inside another, or nested in one another's names


def resolve_interpolations(raw: dict[str, Any], untrainable: list[str] | None = None) -> dict[str, Any]:
    """`raw` with OmegaConf's `${key}` and `${a.b}` replaced by the values they name, as OLMo's loader does. A
    reference that is a whole value takes that value (an int stays an int); one inside a string is replaced by
    its text; a reference inside a reference's name (`${model.${seed}}`) is resolved first, as OmegaConf does.
    Each key is resolved once and remembered (as OmegaConf does), so keys that double one another cost linear
    time, and a resolved value over MAX_RESOLVED characters is refused by key: a config that doubles a string
    thirty times would otherwise need gigabytes before anything else is checked. A cycle is refused naming its
    keys. The resolvers OLMo's published configs use are OLMo's: `${oc.env:NAME,default}`, `${path.choose:a,b}`
    (the first path that exists, or a URL) and `${path.glob:pattern,...}`; a `path.choose` of which no path
    exists resolves to "" as OLMo's loader does when it does not validate paths, which is enough to read a run's
    data, and its message goes to `untrainable` (training refuses it, as OLMo's trainer does). Other resolvers and
    relative references are refused (write the value out), and so is a `${` left in a value after resolution (an
    unclosed one, or an escaped `\\${`)."""
    return _Resolver(raw, untrainable).resolve(raw, "", ())[0]


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


class _Ref:
    """A `${...}` of a value: its name as parts, text and references (whose text is part of the name)."""

    def __init__(self, parts: list[str | _Ref]) -> None:
        self.parts = parts


def _parse(text: str, where: str) -> list[str | _Ref]:
    """`text` as its literal parts and references, references nested in names included."""
    stack: list[list[str | _Ref]] = [[]]
    i, literal = 0, ""
    while i < len(text):
        if text.startswith("\\${", i):  # escaped: a literal `${` (refused later as unresolved, by key)
            literal, i = literal + "${", i + 3
        elif text.startswith("${", i):
            if len(stack) > MAX_DEPTH:
                raise ConfigError(f"config key {where!r}: references nested more than {MAX_DEPTH} deep")
            stack[-1] += [literal] if literal else []
            stack.append([])
            literal, i = "", i + 2
        elif text[i] == "}" and len(stack) > 1:
            inner = stack.pop()
            inner += [literal] if literal else []
            stack[-1].append(_Ref(inner))
            literal, i = "", i + 1
        else:
            literal, i = literal + text[i], i + 1
    if len(stack) > 1:
        raise ConfigError(f"config key {where!r}: {shown(text)} has a `${{` without its `}}`: close it or remove it")
    return stack[0] + ([literal] if literal else [])


def _size(value: Any) -> int:
    if isinstance(value, dict):
        return _ENTRY * len(value) + sum(_size(v) for v in value.values())
    if isinstance(value, list):
        return _ENTRY * len(value) + sum(_size(v) for v in value)
    return len(value) if isinstance(value, str) else 1


class _Resolver:
    """Resolves each key once: `memo` holds every resolved key's value and size."""

    def __init__(self, root: dict[str, Any], untrainable: list[str] | None = None) -> None:
        self.root = root
        self.memo: dict[str, tuple[Any, int]] = {}
        self.untrainable = untrainable if untrainable is not None else []

    def resolve(self, node: Any, where: str, chain: tuple[str, ...]) -> tuple[Any, int]:
        """(value, size) of `node`, the value at key `where`, reached through the references in `chain`."""
        if where in self.memo:
            return self.memo[where]
        if isinstance(node, dict):
            items = {k: self.resolve(v, _join(where, k), chain) for k, v in node.items()}
            done: tuple[Any, int] = (
                {k: v for k, (v, _) in items.items()},
                _ENTRY * len(node) + sum(n for _, n in items.values()),
            )
        elif isinstance(node, list):
            entries = [self.resolve(v, _join(where, i), chain) for i, v in enumerate(node)]
            done = ([v for v, _ in entries], _ENTRY * len(node) + sum(n for _, n in entries))
        elif not isinstance(node, str) or "${" not in node:
            done = (node, _size(node))
        else:
            done = self.string(node, where, (*chain, where))
            if done[1] > MAX_RESOLVED:  # a value made by interpolation (its sections hold values made so too)
                raise ConfigError(
                    f"config key {where!r}: its value resolves to more than {MAX_RESOLVED:,} characters "
                    "(interpolations that repeat one another?): write it out shorter"
                )
        if not where and done[1] > MAX_TOTAL:
            raise ConfigError(
                f"the config resolves to more than {MAX_TOTAL:,} characters (interpolations that repeat one "
                "another?): write it out shorter"
            )
        self.memo[where] = done
        return done

    def string(self, text: str, where: str, chain: tuple[str, ...]) -> tuple[Any, int]:
        parts = _parse(text, where)
        if len(parts) == 1 and isinstance(parts[0], _Ref):
            value, size = self.target(self.name(parts[0], where, chain), where, chain)
        else:
            value = "".join(p if isinstance(p, str) else self.text(p, where, chain) for p in parts)
            size = len(value)
        if isinstance(value, str) and "${" in value:
            raise ConfigError(
                f"config key {where!r}: {shown(text)} leaves `${{` unresolved after interpolation (an escaped "
                "`\\${`, or one made by joining texts): write the value out without it"
            )
        return value, size

    def name(self, ref: _Ref, where: str, chain: tuple[str, ...]) -> str:
        return "".join(p if isinstance(p, str) else self.text(p, where, chain) for p in ref.parts)

    def text(self, ref: _Ref, where: str, chain: tuple[str, ...]) -> str:
        value, _ = self.target(self.name(ref, where, chain), where, chain)
        if isinstance(value, (dict, list)):
            raise ConfigError(
                f"config key {where!r}: a reference inside a string names a section or list: {shown(value)}"
            )
        text = str(value)
        if len(text) > MAX_RESOLVED:
            raise ConfigError(f"config key {where!r}: its value resolves to more than {MAX_RESOLVED:,} characters")
        return text

    def target(self, path: str, where: str, chain: tuple[str, ...]) -> tuple[Any, int]:
        name, colon, args = path.partition(":")
        if colon and name.strip() in _RESOLVERS:
            value = self.resolver(name.strip(), args, path, where)
            return value, _size(value)
        if not path or ":" in path or path.startswith("."):
            raise ConfigError(
                f"config key {where!r}: ${{{path}}} is an OmegaConf resolver or relative reference; only references "
                "to other keys (${a.b}) are resolved here: write the value out"
            )
        if any(c == path or c.startswith(path + ".") for c in chain):  # the key itself, or a section holding it
            raise ConfigError(f"config key {chain[0]!r}: interpolation cycle {' -> '.join((*chain, path))}")
        if len(chain) > MAX_DEPTH:
            raise ConfigError(f"config key {chain[0]!r}: a chain of more than {MAX_DEPTH} references: shorten it")
        node: Any = self.root
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, dict) and part.isdigit() and int(part) in node:  # YAML reads `6198:` as an int
                node = node[int(part)]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ConfigError(f"config key {where!r}: ${{{path}}} names no key of the config")
        value, size = self.resolve(node, path, chain)
        # a section or list is copied, so that changing one place (to_numbers works in place) changes no other
        return (copy.deepcopy(value) if isinstance(value, (dict, list)) else value), size

    def resolver(self, name: str, args: str, path: str, where: str) -> Any:
        """OLMo's resolvers (olmo/config.py registers the path ones; OmegaConf has oc.env), on their arguments
        split at commas, spaces and quotes around each removed."""
        parts = [a.strip().strip("'\"") for a in args.split(",")]
        if name == "oc.env":
            if len(parts) > 2 or not parts[0]:
                raise ConfigError(f"config key {where!r}: ${{{path}}}: oc.env takes a variable's name and a default")
            if parts[0] in os.environ:
                return os.environ[parts[0]]
            if len(parts) == 1:
                raise ConfigError(
                    f"config key {where!r}: ${{{path}}}: the environment variable {parts[0]} is not set (and the "
                    "reference gives no default): set it, or write the value out"
                )
            return None if parts[1] == "null" else parts[1]
        if name == "path.choose":
            for part in parts:
                if "://" in part or os.path.exists(part):
                    return part
            self.untrainable.append(
                f"config key {where!r}: ${{{path}}}: none of {', '.join(parts)} exists (OLMo's path.choose needs "
                "one of them to train)"
            )
            return ""
        matches = [m for part in parts for m in sorted(glob.glob(part))]
        if not matches:
            raise ConfigError(f"config key {where!r}: ${{{path}}}: {', '.join(parts)} matches no file or folder")
        return matches


# OmegaConf's and OLMo's resolvers that OLMo's published configs use (path.last_checkpoint is refused: it asks a
# save folder which checkpoint is newest, which is the run's business, not its config's)
_RESOLVERS = ("oc.env", "path.choose", "path.glob")


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
