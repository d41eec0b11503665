"""Reading chat rows: Tulu-format conversations from JSON lines, parquet or a Hugging Face dataset, checked.

Input rows (JSON lines or parquet, local or remote, or a Hugging Face dataset when `datasets` is installed)
hold `messages`, a list of `{role, content}` with role system, user or assistant, and optionally `id` and
`dataset`. Rows are read in chunks in the main process and parsed in the workers, so a bad row is reported with
its file and line (or row) wherever it was parsed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from olmo_data.documents import TOO_DEEP, file_format, numbered_lines, parquet_batches, too_deep
from olmo_data.errors import DataError
from olmo_data.io import is_remote, open_file, parquet_file

ROLES = ("system", "user", "assistant")
BAD_ROW_HINT = " (use --skip-bad-documents to count and skip such rows)"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Conversation:
    messages: list[tuple[str, str]]
    id: str
    dataset: str
    source: str
    row: int


@dataclass
class RowChunk:
    """A chunk of raw rows of one input: JSON lines as bytes, parquet and hub rows as dicts."""

    source: str
    jsonl: bool
    rows: list[tuple[int, Any]]  # (1-based line or row, payload)


def _check_row(obj: Any) -> str | list[tuple[str, str]]:
    """The messages of a row, or what is wrong with it."""
    if not isinstance(obj, dict):
        return f"expected a JSON object with 'messages', found {type(obj).__name__}"
    if "messages" not in obj:
        return "field 'messages' is missing"
    messages = obj["messages"]
    if not isinstance(messages, (list, tuple)):
        return f"field 'messages' is a {type(messages).__name__}, not a list of {{role, content}}"
    if not messages:
        return "field 'messages' is empty"
    out = []
    for k, msg in enumerate(messages, start=1):
        if not isinstance(msg, dict):
            return f"message {k} is a {type(msg).__name__}, not an object with 'role' and 'content'"
        for key in ("role", "content"):
            if key not in msg:
                return f"message {k} has no {key!r}"
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            return f"message {k} has role {role!r}; expected one of {', '.join(ROLES)}"
        if not isinstance(content, str):
            what = "null" if content is None else f"a {type(content).__name__}"
            return f"message {k} ({role}): 'content' is {what}, not a string"
        try:  # a JSON "\ud800" escape decodes to a str that is not UTF-8; backends would differ on it
            content.encode("utf-8")
        except UnicodeEncodeError:
            return f"message {k} ({role}): 'content' holds a lone surrogate escape (invalid UTF-8)"
        out.append((role, content))
    return out


def parse_rows(task: RowChunk, skip_bad_rows: bool) -> tuple[list[Conversation], list[str]]:
    """The conversations of a chunk of rows, and the messages of its bad rows (raised unless skipped)."""
    conversations, bad = [], []
    for row, payload in task.rows:
        where = f"{task.source}:{row}" if task.jsonl else f"{task.source}: row {row}"
        obj = payload
        checked: str | list[tuple[str, str]]
        try:
            if task.jsonl:
                if too_deep(payload):
                    raise RecursionError  # (the same verdict whatever the caller's recursion limit)
                obj = json.loads(payload)
            checked = _check_row(obj)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            checked = f"malformed JSON ({getattr(e, 'msg', e)})"
        except RecursionError:  # json.loads recurses per nesting level
            checked = TOO_DEEP
        if isinstance(checked, str):
            if not skip_bad_rows:
                raise DataError(f"{where}: {checked}{BAD_ROW_HINT}")
            bad.append(f"{where}: {checked}")
            continue
        cid, dataset = obj.get("id"), obj.get("dataset")
        conversations.append(
            Conversation(
                messages=checked,
                id=str(cid) if cid is not None else f"{os.path.basename(task.source)}:{row}",
                dataset="" if dataset is None else str(dataset),
                source=task.source,
                row=row,
            )
        )
    return conversations, bad


def is_hub_dataset(spec: str) -> bool:
    """Whether an input names a Hugging Face dataset (`org/name` that is not a local path)."""
    return (
        not is_remote(spec)
        and not any(c in spec for c in "*?[")
        and not os.path.exists(os.path.expanduser(spec))
        and _HUB_ID.match(spec) is not None
    )


def row_chunks(paths: Sequence[str], split: str, size: int) -> Iterator[RowChunk]:
    """Chunks of `size` raw rows, input after input, in order. Parsing is left to the workers."""
    for path in paths:
        if is_hub_dataset(path):
            source, jsonl, rows = f"hf:{path}:{split}", False, _hub_rows(path, split)
        elif file_format(path) == "jsonl":
            source, jsonl, rows = path, True, _jsonl_rows(path)
        else:
            source, jsonl, rows = path, False, _parquet_rows(path)
        while chunk := list(itertools.islice(rows, size)):
            yield RowChunk(source, jsonl, chunk)


def _jsonl_rows(path: str) -> Iterator[tuple[int, bytes]]:
    with open_file(path, "rb") as f:
        for line, raw in numbered_lines(f, path):
            if raw.strip():
                yield line, raw


def _parquet_rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    with parquet_file(path) as pf:
        names = pf.schema_arrow.names
        if "messages" not in names:
            raise DataError(f"{path}: no column 'messages' (columns: {', '.join(names)}); expected Tulu-format rows")
        columns = [c for c in ("messages", "id", "dataset") if c in names]
        row = 0
        for batch in parquet_batches(pf, path, 1024, columns):
            for obj in batch.to_pylist():
                row += 1
                yield row, obj


def _hub_rows(name: str, split: str) -> Iterator[tuple[int, Any]]:
    try:
        import datasets  # optional: only where the user installed it
    except ImportError:
        raise DataError(
            f"{name}: no such file; it looks like a Hugging Face dataset id, but the `datasets` library is "
            "not installed. Install it (pip install datasets), or download the dataset's parquet/jsonl files "
            "and give their paths"
        ) from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as e:
        raise DataError(
            f"{name}: could not load split {split!r} from the Hugging Face hub ({type(e).__name__}: {e})"
        ) from e
    yield from enumerate(rows, start=1)


def count_rows(paths: Sequence[str]) -> int | None:
    """About how many rows the inputs hold, for a progress bar's total and ETA: parquet's from its metadata, JSON
    lines' by counting newlines (one read of a local file, as fast as the disk); None where any input is remote
    or a hub dataset (its size is not worth a download)."""
    total = 0
    for path in paths:
        if is_hub_dataset(path) or is_remote(path):
            return None
        if file_format(path) == "parquet":
            with parquet_file(path) as pf:
                total += pf.metadata.num_rows
            continue
        with open_file(path, "rb") as f:
            last = b"\n"
            while block := f.read(1 << 22):
                total += block.count(b"\n")
                last = block[-1:]
            total += last != b"\n"
    return total
