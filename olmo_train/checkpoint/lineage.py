"""Where a checkpoint's weights came from: the `lineage` of trainer_state.json.

A list of parent records: [] for a run started from nothing, one record for a run started from load_path (a new
stage, fine-tuning) or an import, N for a soup. A resumed run keeps its lineage. Each record is

    {"source": "checkpoint" | "import-hf" | "import-olmo" | "import-olmo-core" | "soup",
     "given": the parent as the user wrote it (load_path, a soup's argument, an import's source),
     "resolved": the parent checkpoint's absolute local directory, or its URL,
     "run_name": str, "data_fingerprint": str, "step": int, "tokens_seen": int,
     "weight": the parent's soup weight (a float), or null,
     "counters": "continued" (the child kept the parent's step and token counters) | "restarted" (it counted
                 from zero: a new stage, a reset, a soup, an import); absent in records written before it,
     "lineage": the parent's own lineage records, recursively}

so the whole chain of a model (stage 1, its anneals, their soup, a fine-tune of it) is read from the last
checkpoint alone, even once its parents are deleted. This module only builds, checks and walks records; the
trainer state (layout.py) holds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote
from olmo_data.run import COUNTERS, MAX_DEPTH, SOURCES, checkpoint_identity, counters_continued

_FIELDS: dict[str, str] = {
    "source": "str",
    "given": "str",
    "resolved": "str",
    "run_name": "str",
    "data_fingerprint": "str",
    "step": "int",
    "tokens_seen": "int",
    "weight": "float?",
    "lineage": "list",
}


class _State(Protocol):  # layout.TrainerState, without importing it (layout imports this module)
    run_name: str
    data_fingerprint: str
    step: int
    tokens_seen: int
    lineage: list[dict[str, Any]]


def resolved_location(given: str, local: Path | None = None) -> str:
    """A URL as it is; a local path made absolute (`local`: where it was found, if not at `given` itself)."""
    if is_remote(given):
        return given.rstrip("/")
    return str((local if local is not None else Path(given)).expanduser().resolve())


def parent_record(
    source: str,
    given: str,
    location: str,
    local: Path,
    parent: _State,
    weight: float | None = None,
    *,
    continued: bool = False,
) -> dict[str, Any]:
    """The record naming `parent` (the trainer state of the checkpoint at `local`, reached as `location`);
    `continued`: the child keeps the parent's counters (so its tokens_seen already holds the parent's)."""
    return {
        "source": source,
        "given": given,
        "resolved": resolved_location(location, None if is_remote(location) else local),
        "run_name": parent.run_name,
        "data_fingerprint": parent.data_fingerprint,
        "step": parent.step,
        "tokens_seen": parent.tokens_seen,
        "weight": weight,
        "counters": "continued" if continued else "restarted",
        "lineage": list(parent.lineage),
    }


def import_record(source: str, given: str) -> dict[str, Any]:
    """The record of an imported model (import-hf, import-olmo, import-olmo-core): its source directory, model name
    or URL."""
    location = given if is_remote(given) or not Path(given).expanduser().exists() else resolved_location(given)
    return {
        "source": source,
        "given": given,
        "resolved": location,
        "run_name": "",
        "data_fingerprint": "",
        "step": 0,
        "tokens_seen": 0,
        "weight": None,
        "counters": "restarted",
        "lineage": [],
    }


def check_lineage(value: Any, where: str, key: str = "lineage", depth: int = 0) -> None:
    """Each record's fields by key and type, recursively; a damaged record is named by its position. A lineage
    deeper than MAX_DEPTH stages is refused (a loop, or crafted), so that walking it never overflows the stack."""
    if depth > MAX_DEPTH:
        raise DataError(
            f"{where}: the lineage is more than {MAX_DEPTH} stages deep (at {key.split('.lineage')[0]}...); the "
            "checkpoint is damaged"
        )
    if not isinstance(value, list):
        raise DataError(
            f"{where}: {key} must be a list of parent records, got {shown(value)}; the checkpoint is damaged"
        )
    for i, record in enumerate(value):
        at = f"{key}[{i}]"
        if not isinstance(record, dict):
            raise DataError(f"{where}: {at} must be a mapping, got {shown(record)}; the checkpoint is damaged")
        for name, kind in _FIELDS.items():
            if name not in record:
                raise DataError(f"{where}: {at} has no {name!r}; the checkpoint is damaged")
            v = record[name]
            if kind == "str":
                ok, expected = isinstance(v, str), "a string"
            elif kind == "int":
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
                expected = "an integer of 0 or more"
            elif kind == "float?":
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                expected = "a number or null"
            else:
                ok, expected = True, ""
            if not ok:
                raise DataError(f"{where}: {at}.{name} must be {expected}, got {shown(v)}; the checkpoint is damaged")
        if record.get("counters") not in COUNTERS:
            raise DataError(
                f'{where}: {at}.counters must be "continued", "restarted" or absent, got '
                f"{shown(record.get('counters'))}; the checkpoint is damaged"
            )
        if record["source"] not in SOURCES:
            raise DataError(
                f"{where}: {at}.source must be one of {list(SOURCES)}, got {shown(record['source'])}; the checkpoint "
                "is damaged"
            )
        check_lineage(record["lineage"], where, f"{at}.lineage", depth + 1)


def walk(lineage: list[dict[str, Any]], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """Every record of a lineage, depth first, with its depth (0: a direct parent)."""
    out: list[tuple[int, dict[str, Any]]] = []
    for record in lineage:
        out.append((depth, record))
        out.extend(walk(record["lineage"], depth + 1))
    return out


def total_tokens(own_tokens: int, own_fingerprint: str, lineage: list[dict[str, Any]]) -> int:
    """Tokens trained on to make this model: its own stage's and every ancestor stage's, shared ancestors (a
    soup's parents' common stage 1, reached through its sharded or its unsharded copy) once. A stage whose
    counters continued its parent's (a plain load_path restart) already holds the parent's tokens in its own
    count, so such a parent adds nothing; the record's `counters` says so, and a record older than that key is
    guessed from the same data fingerprint and counters not below the parent's."""
    seen: set[tuple[str, str, int, str]] = set()
    total = own_tokens

    def add(records: list[dict[str, Any]], fingerprint: str, tokens: int) -> None:
        nonlocal total
        for r in records:
            key = checkpoint_identity(r)
            if key in seen:
                continue
            seen.add(key)
            continued = counters_continued(r)
            if continued is None:  # an older record: guessed
                same = r["source"] == "checkpoint" and r["data_fingerprint"] == fingerprint != ""
                continued = same and tokens >= r["tokens_seen"]
            if not continued:
                total += r["tokens_seen"]
            add(r["lineage"], r["data_fingerprint"], r["tokens_seen"])

    add(lineage, own_fingerprint, own_tokens)
    return total


def describe(state: _State) -> list[str]:
    """Lines showing a checkpoint's lineage, one per stage (indented by depth), and the tokens in total."""
    lines = [f"lineage: {state.run_name or '(unnamed)'} at step {state.step}, {state.tokens_seen:,} tokens seen"]
    for depth, r in walk(state.lineage):
        weight = f", weight {r['weight']:g}" if r["weight"] is not None else ""
        name = r["run_name"] or "(no run)"
        lines.append(
            f"{'  ' * (depth + 1)}<- {r['source']}: {name} step {r['step']}, {r['tokens_seen']:,} tokens"
            f"{weight} ({r['resolved']})"
        )
    total = total_tokens(state.tokens_seen, state.data_fingerprint, state.lineage)
    lines.append(f"tokens in total (all stages, shared ancestors once): {total:,}")
    return lines
