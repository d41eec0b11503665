"""Reading documents in dolma format from JSON lines or parquet, local or remote.

A dolma document is one JSON object per line with `id`, `text`, `source` and optionally `added`, `created` and
`metadata`. Parquet files hold the same fields as columns. Other layouts name their fields with `text_field` and
`id_field`. Bad input is an error naming the file and the line (1-based; for parquet, the 1-based row), unless the
caller asks to skip bad documents, in which case they are counted in a `BadDocuments` record.

Reading is a visible share of `olmo-data tokenize`'s time, so two optional libraries (the `fast` extra) take the
common case where installed: python-isal's igzip inflates local `.gz` files (ISA-L, about 3x zlib; the same bytes,
as any inflater gives), and msgspec parses only the three fields read (`_FastFields`). Each is used only where its
answer is provably the standard library's (see `_fast_document`); everything else, bad lines included, takes the
standard path, so documents, errors and skipped counts are the same with or without them.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from olmo_data.errors import DataError
from olmo_data.io import is_remote, open_file, parquet_file

COMPRESSIONS = (".gz", ".zst", ".zstd", ".bz2")
JSON_EXTENSIONS = (".jsonl", ".json", ".ndjson")
# what a line nested deeper than MAX_DEPTH is called. json.loads and msgspec recurse per level, so without a limit
# of its own the verdict on a deep line would depend on the caller's recursion limit (a program that raised it would
# read lines another refuses); 512 is below what either parser reaches under Python's default limit of 1,000.
TOO_DEEP = "JSON nested too deeply to read (arrays or objects inside each other more than 512 levels deep)"
MAX_DEPTH = 512
LINE_BUFFER = 1024 * 1024  # bytes of a decompressed .gz file read at a time (`_open_jsonl`)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_ESCAPE = re.compile(rb"\\u00[57][bB]")  # a JSON string's `[` or `{` written as an escape
# Whether the `fast` extra's readers are used where installed (tests turn it off to compare both paths).
FAST_READING = True


@dataclass
class Document:
    """One document, with where it came from: `line` is the 1-based line (JSON) or row (parquet)."""

    id: str
    text: str
    source: str
    line: int
    raw: bytes | None = None  # the original JSON line, kept so `sample` can copy documents byte for byte


@dataclass
class BadDocuments:
    """Counts of documents skipped as bad, with the first few reasons kept for the report."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append(message)


class ReadPosition:
    """How many of its file's own bytes (compressed, where it is) a reader has consumed, for progress bars that
    know the input sizes. Known for local plain and gzip files; elsewhere `bytes()` is None and callers credit the
    file when it is done."""

    def __init__(self) -> None:
        self._raw: IO[bytes] | None = None

    def attach(self, f: IO[Any]) -> None:
        inner: Any = _line_buffered_gzip(f) or f
        raw: Any = inner.fileobj if isinstance(inner, gzip.GzipFile) else inner
        self._raw = raw if hasattr(raw, "fileno") and hasattr(raw, "tell") else None

    def bytes(self) -> int | None:
        try:
            return None if self._raw is None else int(self._raw.tell())
        except (OSError, ValueError):  # closed, or not seekable after all
            return None


def file_format(path: str) -> str:
    """'jsonl' or 'parquet', from the file name (a compression suffix is looked through)."""
    name = path.rsplit("/", 1)[-1].split("?", 1)[0].lower()
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith(JSON_EXTENSIONS):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise DataError(
        f"{path}: unsupported file type; expected .json/.jsonl/.ndjson (optionally .gz or .zst) or .parquet"
    )


def read_documents(
    path: str,
    *,
    text_field: str = "text",
    id_field: str = "id",
    bad: BadDocuments | None = None,
    keep_raw: bool = False,
    position: ReadPosition | None = None,
) -> Iterator[Document]:
    """Yield the documents of one file in file order.

    With `bad` given, bad documents are counted there and skipped; without it the first one raises `DataError`.
    With `position` given, it follows how far into the file the reading is.
    """
    fmt = file_format(path)
    if fmt == "jsonl":
        yield from _read_jsonl(path, text_field, id_field, bad, keep_raw, position)
    else:
        yield from _read_parquet(path, text_field, id_field, bad)


def _fail(message: str, bad: BadDocuments | None) -> None:
    if bad is None:
        raise DataError(message + " (use --skip-bad-documents to count and skip such documents)")
    bad.add(message)


def _read_jsonl(
    path: str, text_field: str, id_field: str, bad: BadDocuments | None, keep_raw: bool, position: ReadPosition | None
) -> Iterator[Document]:
    default_id = os.path.basename(path)
    fast = _fast_fields(text_field, id_field) if FAST_READING else None
    with _open_jsonl(path) as f:
        if position is not None:
            position.attach(f)
        # igzip through our line buffer: a damaged file fails up to LINE_BUFFER bytes of lines before the damage,
        # so the error counts the good lines again with igzip's own small buffer, to name the last one
        recount = functools.partial(_lines_before_damage, path) if _line_buffered_gzip(f) else None
        for lineno, raw in numbered_lines(f, path, recount):
            if not raw or raw.isspace():  # (as `not raw.strip()`, without copying the line)
                continue
            got = _fast_document(fast, raw) if fast is not None else None
            if too_deep(raw, got[0] if got is not None else None):
                _fail(f"{path}:{lineno}: {TOO_DEEP}", bad)
                continue
            if got is not None:
                yield Document(
                    id=str(got[1]) if got[1] is not None else f"{default_id}:{lineno}",
                    text=got[0],
                    source=str(got[2]),
                    line=lineno,
                    raw=raw if keep_raw else None,
                )
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                _fail(f"{path}:{lineno}: invalid UTF-8 at byte {e.start} of the line", bad)
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                _fail(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})", bad)
                continue
            except RecursionError:  # the C decoder recurses per level: a hostile line must not crash the run
                _fail(f"{path}:{lineno}: {TOO_DEEP}", bad)
                continue
            if not isinstance(obj, dict):
                _fail(f"{path}:{lineno}: expected a JSON object, found {type(obj).__name__}", bad)
                continue
            text = obj.get(text_field)
            if not isinstance(text, str):
                what = "missing" if text_field not in obj else f"a {type(text).__name__}, not a string"
                _fail(f"{path}:{lineno}: field {text_field!r} is {what}", bad)
                continue
            if _lone_surrogate(raw, text):
                _fail(f"{path}:{lineno}: field {text_field!r} holds a lone surrogate escape (invalid UTF-8)", bad)
                continue
            doc_id = obj.get(id_field)
            yield Document(
                id=str(doc_id) if doc_id is not None else f"{default_id}:{lineno}",
                text=text,
                source=str(obj.get("source", "")),
                line=lineno,
                raw=raw if keep_raw else None,
            )


def _lone_surrogate(raw: bytes, text: str) -> bool:
    """Whether `text` (parsed from `raw`) holds a lone surrogate: a `\\ud800`-style escape decodes to a str that is
    not UTF-8 (only an escape can put one there, so lines without one are not looked at)."""
    if b"\\ud" not in raw and b"\\uD" not in raw:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@contextlib.contextmanager
def _open_jsonl(path: str) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed: a local `.gz` by python-isal's igzip where installed (the same bytes as
    zlib's, about 3x faster; a damaged file fails as with gzip, and its error names the same last good line as
    igzip's own reader does, `_lines_before_damage`), everything else by `open_file`. igzip's lines come through a
    buffer of LINE_BUFFER bytes: its own is 8 KiB, so a long line took several refills, each a call into the
    inflater (lines of a 157 MB half of the tokenize benchmark's corpus: 0.19 -> 0.15 CPU s)."""
    if not (FAST_READING and path.endswith(".gz") and not is_remote(path) and _igzip() is not None):
        with open_file(path, "rb") as f:
            yield f
        return
    with _igzip_file(path) as gz, io.BufferedReader(gz, buffer_size=LINE_BUFFER) as lines:
        yield lines


@contextlib.contextmanager
def _igzip_file(path: str) -> Iterator[gzip.GzipFile]:
    """A local `.gz` file opened with igzip, its own buffer unchanged."""
    with open_file(path, "rb", compression="disable") as raw, _igzip().IGzipFile(fileobj=raw, mode="rb") as f:
        yield f


def _line_buffered_gzip(f: IO[Any]) -> gzip.GzipFile | None:
    """The gzip file inside `_open_jsonl`'s line buffer, where `f` is one (else None)."""
    inner = getattr(f, "raw", None) if isinstance(f, io.BufferedReader) else None
    return inner if isinstance(inner, gzip.GzipFile) else None


def _lines_before_damage(path: str) -> int:
    """The whole lines igzip's own reader (8 KiB at a time) yields from a damaged `.gz` file before it fails: as
    many as before `_open_jsonl` had its larger buffer (which loses what its last fill held)."""
    lines = 0
    with contextlib.suppress(Exception), _igzip_file(path) as f:
        for _ in f:
            lines += 1
    return lines


@functools.cache
def _igzip() -> Any:
    try:
        from isal import igzip
    except ImportError:
        return None
    return igzip


# Field values the fast path hands on as they are: the types whose `str()` cannot depend on the parser (floats and
# containers go the standard way, where a JSON number's rounding or a huge integer could differ)
_PLAIN_TYPES = (str, bool, type(None))
_INT_RANGE = range(-(1 << 63), 1 << 64)


@dataclass(frozen=True)
class _FastFields:
    """msgspec's decoder of a line's text, id and source fields (the rest of the line is checked, not built)."""

    decode: Callable[[bytes], Any]
    error: type[Exception]


@functools.cache
def _fast_fields(text_field: str, id_field: str) -> _FastFields | None:
    """The msgspec decoder of these fields, or None without msgspec (or for field names that coincide)."""
    if len({text_field, id_field, "source"}) < 3:
        return None
    try:
        import msgspec
    except ImportError:
        return None
    fields = [("text", object, None), ("id", object, None), ("source", object, "")]
    rename = {"text": text_field, "id": id_field, "source": "source"}
    struct = msgspec.defstruct("DocumentFields", fields, rename=rename)
    return _FastFields(msgspec.json.Decoder(struct).decode, msgspec.DecodeError)


def too_deep(raw: bytes, text: str | None = None) -> bool:
    """Whether a JSON line nests arrays and objects more than MAX_DEPTH levels deep. That takes more than MAX_DEPTH
    opening brackets, so most lines are cleared by a count of them; a line with more (source code, say) is cleared
    too when `text`, its parsed text field, holds all but MAX_DEPTH of them, as those are inside a string (unless
    the line escapes a bracket as `\\u005b` or `\\u007b`, when the text's brackets may not all be in the line as
    such). Only what is left is measured by `nesting_depth`.

    Before any counting, a line whose parsed text leaves at most MAX_DEPTH bytes of it (a dolma line: a long text,
    short metadata) is cleared: every character of the text took at least one byte of the line (an escape takes
    more), none of the brackets in those bytes count, so at most MAX_DEPTH bytes are left for brackets that do.
    That spares prose most of the check (the count's pass is ~8 ms of the ~120 ms a 31 MB corpus takes to read);
    code, with an escaped newline or quote every few dozen bytes, is mostly counted still (on the tokenize
    benchmark's corpus of Python source, 1,064 of 1,710 lines are cleared so, holding 12% of its bytes)."""
    if len(raw) <= MAX_DEPTH or (text is not None and len(raw) - len(text) <= MAX_DEPTH):
        return False
    if (count := bracket_count(raw)) <= MAX_DEPTH:
        return False
    if text is not None and not (b"\\u00" in raw and _BRACKET_ESCAPE.search(raw)):
        if count - (text.count("[") + text.count("{")) <= MAX_DEPTH:
            return False
    return nesting_depth(raw) > MAX_DEPTH


def bracket_count(raw: bytes) -> int:
    """How many `[` and `{` a line holds. A long line is counted by numpy in one vectorised pass (`b | 0x20` is
    0x7B for exactly these two bytes), about 2.5x two `bytes.count` calls; a short one by those, which cost less to
    start."""
    if len(raw) < 4096:
        return raw.count(b"[") + raw.count(b"{")
    import numpy as np  # (here: the commands that read documents need not wait for numpy to start)

    return int(np.count_nonzero((np.frombuffer(raw, np.uint8) | 0x20) == 0x7B))


def nesting_depth(raw: bytes) -> int:
    """How deep a JSON line nests arrays and objects (brackets inside strings do not count). Strings are cut out
    without a parser: escaped backslashes, then escaped quotes, are dropped (a run of backslashes escapes in pairs
    from its left), so every quote left opens or closes a string and every other piece between quotes is outside
    one. All C-speed byte operations, so text full of brackets costs little."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in outside:
        depth += 1 if b in (0x5B, 0x7B) else -1
        deepest = max(deepest, depth)
    return deepest


def _fast_document(fast: _FastFields, raw: bytes) -> tuple[str, Any, Any] | None:
    """(text, id, source) of a line as the standard path would read them, or None for the standard path to read
    it. msgspec takes strict JSON only: NaN, infinite numbers and lone surrogate escapes in the fields it builds
    are refused, and so go the standard way (test_documents pins this). It does not check the UTF-8 of the fields
    it skips, so that is checked here first. A text, id or source that is not a string, boolean, null or 64-bit
    integer is left to the standard path too (a float's or a container's `str()` could depend on the parser), as
    is every bad line: the standard path words the errors."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        doc = fast.decode(raw)
    except (fast.error, RecursionError):  # (msgspec recurses per level of what it skips too)
        return None
    text, doc_id, source = doc.text, doc.id, doc.source
    if type(text) is not str:
        return None
    for value in (doc_id, source):
        if not (isinstance(value, _PLAIN_TYPES) or (type(value) is int and value in _INT_RANGE)):
            return None
    return text, doc_id, source


def numbered_lines(f: IO[bytes], path: str, recount: Callable[[], int] | None = None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of an open file. A file that cannot be read to its end (a download cut short
    leaves a truncated .gz; a damaged .zst) raises DataError naming the file and the last good line: the
    decompressors' own EOFError or OSError says neither, and click would report it as just "Aborted!". `recount`,
    where given, counts the good lines again, for a reader whose read-ahead drops some of them when it fails."""
    lines = iter(f)
    lineno = 0
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except Exception as e:  # only the read itself is inside the try: EOFError, OSError, zlib/zstd errors
            if recount is not None:
                lineno = max(lineno, recount())
            raise DataError(
                f"{path}: cannot be read past line {lineno} ({type(e).__name__}: {e}); the file is truncated or "
                "corrupt: download or copy it again"
            ) from e
        lineno += 1
        yield lineno, raw


def parquet_batches(pf: Any, path: str, batch_size: int, columns: list[str]) -> Iterator[Any]:
    """The record batches of an open parquet file; a damaged page or row group raises DataError naming the file
    and the rows read before it, as `numbered_lines` does for JSON lines."""
    batches = pf.iter_batches(batch_size=batch_size, columns=columns)
    rows = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:
            raise DataError(
                f"{path}: cannot be read past row {rows} ({type(e).__name__}: {e}); the file is truncated or "
                "corrupt: download or copy it again"
            ) from e
        rows += batch.num_rows
        yield batch


def _read_parquet(path: str, text_field: str, id_field: str, bad: BadDocuments | None) -> Iterator[Document]:
    default_id = os.path.basename(path)
    with parquet_file(path) as pf:
        names = pf.schema_arrow.names
        if text_field not in names:
            raise DataError(f"{path}: no column {text_field!r} (columns: {', '.join(names)}); use --text-field")
        columns = [c for c in (text_field, id_field, "source") if c in names]
        row = 0
        for batch in parquet_batches(pf, path, 4096, columns):
            data = batch.to_pydict()
            texts = data[text_field]
            ids = data.get(id_field, [None] * len(texts))
            sources = data.get("source", [None] * len(texts))
            for text, doc_id, source in zip(texts, ids, sources, strict=True):
                row += 1
                if not isinstance(text, str):
                    what = "null" if text is None else f"a {type(text).__name__}, not a string"
                    _fail(f"{path}: row {row}: column {text_field!r} is {what}", bad)
                    continue
                yield Document(
                    id=str(doc_id) if doc_id is not None else f"{default_id}:{row}",
                    text=text,
                    source="" if source is None else str(source),
                    line=row,
                )
