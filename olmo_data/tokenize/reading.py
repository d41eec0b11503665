"""Reading an input into the encoder's batches: in a thread beside the encoding (`prefetched`), and, while the
engine is still loading, ahead in the parent process (`read_ahead`).

Why read ahead in the parent: an engine that loads on a thread of its own (fastokens: 0.2-0.3 s, without the GIL)
leaves the parent's main thread, and a core, idle until it is ready, and the workers can only be forked after it
is, as they inherit the loaded engine (a fork copies no threads). So for that time the parent opens the first
inputs and reads their first batches itself; the worker that takes such an input, forked later, holds a copy of
those batches and of the open reader, and goes on from where the parent stopped. The batches are the ones it would
have read itself (the same reader, cut by the same rule, errors raised where they were met), so the output cannot
change; only which process did the reading does. On a small corpus that is all of its reading.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from olmo_data.documents import BadDocuments, Document, ReadPosition, file_format, read_documents
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_data.tokenize.options import TokenizeOptions

BATCH_DOCUMENTS = 512  # documents per encode call: large enough to amortise call overhead
BATCH_CHARS = 1024 * 1024  # ... but bounded in size: memory stays small and the progress bar moves
PREFETCH_BATCHES = 2  # batches read ahead by the reading thread while one is encoded
# What the parent may read ahead in all while the engine loads: about the 0.2-0.3 s a load takes, at the ~300 MB/s
# of text one core reads and parses (gzip JSON lines); the memory that costs is held only until the workers take it.
READ_AHEAD_CHARS = 64 * 1024 * 1024


@dataclass
class Batch:
    """Documents read and stripped, ready to encode; `at`: the input's bytes read by then (for the progress bar)."""

    docs: list[Document]
    texts: list[str]
    chars: int
    at: int | None


def batches(read: Iterator[Document], position: ReadPosition, empty: list[int]) -> Iterator[Batch]:
    """The non-empty documents of `read` in batches of at most BATCH_DOCUMENTS documents or BATCH_CHARS characters
    (the one that passes the size comes along); `empty[0]` counts the others."""
    docs: list[Document] = []
    texts: list[str] = []
    chars = 0
    for doc in read:
        text = doc.text.strip()
        if not text:
            empty[0] += 1
            continue
        docs.append(doc)
        texts.append(text)
        chars += len(text)
        if len(docs) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            yield Batch(docs, texts, chars, position.bytes())
            docs, texts, chars = [], [], 0
    if docs:
        yield Batch(docs, texts, chars, position.bytes())


@dataclass
class InputReader:
    """One input's batches, with what its reading counts (`empty`, `bad`) and how far into the file it is; the
    batches read ahead wait in `ahead`, and an error met while reading them ahead waits in `error`."""

    path: str
    position: ReadPosition
    empty: list[int]
    bad: BadDocuments | None
    rest: Iterator[Batch]
    ahead: deque[Batch] = field(default_factory=deque)
    error: Exception | None = None
    ended: bool = False

    @classmethod
    def open(cls, path: str, options: TokenizeOptions) -> InputReader:
        """A reader of `path` (nothing is opened until its first batch is asked for)."""
        bad = BadDocuments() if options.skip_bad_documents else None
        position, empty = ReadPosition(), [0]
        docs = read_documents(
            path,
            text_field=options.text_field,
            id_field=options.id_field,
            bad=bad,
            position=position,
        )
        return cls(path, position, empty, bad, batches(docs, position, empty))

    def read_one(self) -> int:
        """Read one more batch ahead; returns its characters (0 at the end, or at an error, kept for `batches`)."""
        try:
            batch = next(self.rest)
        except StopIteration:
            self.ended = True
            return 0
        except Exception as e:  # raised by `batches` where it was met: after the batches before it
            self.error, self.ended = e, True
            return 0
        self.ahead.append(batch)
        return batch.chars

    def batches(self) -> Iterator[Batch]:
        """Every batch in order: those read ahead (each dropped once handed on), then the rest of the file."""
        while self.ahead:
            yield self.ahead.popleft()
        if self.error is not None:
            raise self.error
        if not self.ended:
            yield from self.rest

    def close(self) -> None:
        """Close the file (its reader's generator); the batches not handed on are dropped."""
        self.ahead.clear()
        close = getattr(self.rest, "close", None)
        if close is not None:
            close()


def can_read_ahead(path: str) -> bool:
    """Local JSON lines only: a remote reader's connections and threads, and pyarrow's thread pools (parquet), are
    not to be carried across a fork."""
    if is_remote(path):
        return False
    try:
        return file_format(path) == "jsonl"
    except DataError:
        return False


def read_ahead(
    inputs: Sequence[tuple[int, str]],
    options: TokenizeOptions,
    loading: Callable[[], bool],
    width: int,
    budget: int = READ_AHEAD_CHARS,
) -> dict[int, InputReader]:
    """Readers of the first of `inputs` ((index, path), in the order the workers take them), with their first
    batches read, for as long as `loading()` says the engine is still loading and `budget` characters allow: one
    batch at a time from each of `width` inputs in turn (the ones the workers start on), the next input joining as
    one ends. An interrupt closes every file opened and goes on up."""
    readers: dict[int, InputReader] = {}
    waiting = deque((index, path) for index, path in inputs if can_read_ahead(path))
    turn: deque[InputReader] = deque()
    spent = 0
    try:
        while spent < budget and loading():
            while len(turn) < width and waiting:
                index, path = waiting.popleft()
                readers[index] = InputReader.open(path, options)
                turn.append(readers[index])
            if not turn:
                break
            reader = turn.popleft()
            spent += reader.read_one()
            if not reader.ended:
                turn.append(reader)
    except BaseException:
        for reader in readers.values():
            reader.close()
        raise
    return readers


def prefetched(items: Iterator[Batch], depth: int = PREFETCH_BATCHES) -> Generator[Batch, None, None]:
    """`items`, made by a thread while the caller encodes the ones before: reading, decompressing and parsing
    overlap encoding, since the engines (and zlib) release the GIL while they work. At most `depth` batches wait.
    An error of the reading thread is raised here, in the caller; a caller that stops early (an error, `Stopped`)
    ends the thread at its next batch and waits for it, so the input file is closed when this returns."""
    ready: queue.Queue[tuple[bool, Any]] = queue.Queue(depth)
    done = threading.Event()
    end = object()

    def put(item: tuple[bool, Any]) -> bool:
        while not done.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, end))
        except BaseException as e:  # handed to the caller, which raises it with its file and line
            put((False, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the reader's file, closed in the thread that reads it

    thread = threading.Thread(target=run, name="olmo-data-read", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = ready.get()
            if not ok:
                raise item
            if item is end:
                return
            yield item
    finally:
        done.set()
        thread.join()


def close_all(readers: dict[int, InputReader]) -> None:
    """Close the readers left (in the parent, once its workers are done with the copies they hold)."""
    for reader in readers.values():
        with contextlib.suppress(Exception):
            reader.close()
    readers.clear()
