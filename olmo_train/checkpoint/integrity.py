"""checksums.json: the size and SHA-256 of every file of a checkpoint, taken as it is written, checked when read.

A byte flipped or cut inside a tensor's data loads silently as another weight (only a damaged header fails, and
then without naming a file), and a checkpoint is copied between machines, downloaded and kept for years. So each
checkpoint lists its files as {"version": 1, "files": {relative path: {"size": n, "sha256": hex}}}, and a load
refuses a file that differs, by name, before reading it.

The hashes come from the bytes as they are written, not from reading the checkpoint back: DCP writes through a
file system whose streams hash what passes through them, `torch.save` writes into a hashing stream, and each rank
hashes the files it writes itself (its shards, its RNG state); rank 0 gathers them and writes checksums.json
just before trainer_state.json, the file that marks a checkpoint complete (whose bytes, known before they are
written, are listed too). Only small files written by other helpers (config.yaml) are hashed after writing.
A checkpoint saved before checksums existed still loads, with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from olmo_data.display import progress_bar
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, sha256_file, write_json_atomic
from olmo_train.checkpoint.layout import CHECKSUMS, TRAINER_STATE, TrainerState
from olmo_train.checkpoint.safety import confined

VERSION = 1
_CHUNK = 1 << 22
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
AGAIN = "copy the checkpoint again"

log = logging.getLogger(__name__)

Record = dict[str, Any]  # {"size": int, "sha256": str}


def record_of(data: bytes) -> Record:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def hash_file(path: Path) -> Record:
    return {"size": path.stat().st_size, "sha256": sha256_file(str(path), _CHUNK)}


@functools.cache
def _hasher(pid: int) -> ThreadPoolExecutor:
    """One hashing thread per process (by pid: a forked child has none of its parent's threads)."""
    return ThreadPoolExecutor(1, thread_name_prefix="checksums")


class _HashingStream(io.IOBase):
    """A binary file being written, hashed on the way. Bytes written in order are hashed as they pass (a large
    buffer in another thread while it is written: both release the GIL, so the hash costs little more than the
    write); if the writer ever seeks, the finished file is hashed from disk instead (correct, only slower)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._sha = hashlib.sha256()
        self._hashed = 0
        self._in_order = True

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if not self._in_order:
            return self._raw.write(data)  # type: ignore[no-any-return]
        hashed = _hasher(os.getpid()).submit(self._sha.update, data) if memoryview(data).nbytes >= _CHUNK else None
        n: int = self._raw.write(data)  # a buffered file: all of it, or an error
        if hashed is None:
            self._sha.update(data)
        else:
            hashed.result()  # before the next write: the hash sees the bytes in order
        self._hashed += n
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._in_order = False
        return self._raw.seek(offset, whence)

    def seekable(self) -> bool:
        return self._raw.seekable()

    def fileno(self) -> int:
        return self._raw.fileno()

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:  # the file itself is closed by whoever opened it
        if not self.closed:
            self._raw.flush()
        super().close()

    def record(self, path: Path) -> Record:
        self._raw.flush()
        size = os.fstat(self._raw.fileno()).st_size
        if self._in_order and self._hashed == size:
            return {"size": size, "sha256": self._sha.hexdigest()}
        return hash_file(path)


@contextlib.contextmanager
def hashing_open(path: Path) -> Iterator[tuple[_HashingStream, Record]]:
    """Open `path` for writing; the record dict yielded is filled with its size and SHA-256 when the block ends."""
    record: Record = {}
    with open(path, "wb") as raw:
        stream = _HashingStream(raw)
        try:
            yield stream, record
            record.update(stream.record(path))
        finally:
            stream.close()  # while the file is open: closed later (when collected), it would flush a closed file


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording every file written through it (and following its renames: DCP writes
    `.metadata.tmp` and renames it)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[Path, Record] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with hashing_open(Path(path)) as (stream, record):
            yield stream
        with self._lock:
            self.records[Path(path)] = record

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            if Path(path) in self.records:
                self.records[Path(new_path)] = self.records.pop(Path(path))


class HashingWriter(FileSystemWriter):
    """DCP's FileSystemWriter (same defaults as `dcp.save(checkpoint_id=...)`) that records what it writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fs: HashingFileSystem = HashingFileSystem()

    def written(self) -> dict[str, Record]:
        """What this rank wrote: {name relative to the checkpoint directory: record}."""
        root = Path(self.path)
        return {p.relative_to(root).as_posix(): r for p, r in self.fs.records.items() if p.exists()}


class Recorder:
    """The files of one checkpoint directory, recorded as they are written; `finish` writes checksums.json and
    then the file that marks the checkpoint complete."""

    def __init__(self, root: Path, files: dict[str, Record] | None = None) -> None:
        self.root = root
        self.files: dict[str, Record] = dict(files or {})

    def torch_save(self, obj: Any, name: str) -> None:
        with hashing_open(self.root / name) as (stream, record):
            torch.save(obj, cast(IO[bytes], stream))
        self.files[name] = record

    def copy(self, source: Path, name: str) -> None:
        with open(source, "rb") as src, hashing_open(self.root / name) as (stream, record):
            shutil.copyfileobj(src, stream, _CHUNK)
        self.files[name] = record

    def add_file(self, name: str) -> None:
        """A small file written by another helper (config.yaml), hashed from disk."""
        self.files[name] = hash_file(self.root / name)

    def finish(self, last: str, data: bytes, between: Callable[[], None] | None = None) -> None:
        """checksums.json, listing `last` too, then `last` itself (written atomically); `between` runs between
        the two (a test's pause)."""
        self.files[last] = record_of(data)
        write_json_atomic(self.root / CHECKSUMS, {"version": VERSION, "files": self.files})
        if between is not None:
            between()
        with atomic_path(self.root / last) as tmp:
            tmp.write_bytes(data)


def read_checksums(directory: Path) -> dict[str, Record] | None:
    """{relative path: record} from a checkpoint's checksums.json, each path checked to stay inside it; None
    when it has none. A malformed one is refused by name: it is then no record of anything."""
    path = directory / CHECKSUMS
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not readable as JSON ({e}); {AGAIN}") from e
    if not isinstance(obj, dict) or obj.get("version") != VERSION or not isinstance(obj.get("files"), dict):
        raise DataError(f"{path}: expected {{'version': {VERSION}, 'files': {{...}}}}; {AGAIN}")
    files: dict[str, Record] = obj["files"]
    for name, rec in files.items():
        confined(directory, name, path)
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("size"), int)
            and isinstance(rec.get("sha256"), str)
            and _SHA256.match(rec["sha256"])
        ):
            raise DataError(f"{path}: the entry of {name} is not {{'size': int, 'sha256': hex}}; {AGAIN}")
    return files


def read_trainer_state(path: Path) -> TrainerState:
    """A complete checkpoint's trainer state, its bytes checked against checksums.json before they are parsed
    (a damaged file is named as damaged, not as a JSON error or, worse, read as another step)."""
    state_path = path / TRAINER_STATE
    if not state_path.is_file():
        raise DataError(f"{path}: not a complete checkpoint (no {TRAINER_STATE}); give a stepN directory")
    data = state_path.read_bytes()
    records = read_checksums(path)
    if records is not None and TRAINER_STATE in records and record_of(data) != records[TRAINER_STATE]:
        raise _differs(str(state_path), record_of(data), records[TRAINER_STATE])
    return TrainerState.parse(data, state_path)


def check_record(path: Path, expected: Record) -> None:
    """Refuse `path` by name unless it has the recorded size and SHA-256 (the size is checked first: cheap)."""
    if not path.is_file():
        raise DataError(f"{path}: missing, though {CHECKSUMS} lists it; the checkpoint is incomplete ({AGAIN})")
    if path.stat().st_size != expected["size"]:
        raise _differs(str(path), {"size": path.stat().st_size, "sha256": ""}, expected)
    actual = hash_file(path)
    if actual != expected:
        raise _differs(str(path), actual, expected)


def _differs(name: str, actual: Record, expected: Record) -> DataError:
    if actual["size"] != expected["size"]:
        what = "truncated" if actual["size"] < expected["size"] else "longer than written"
        return DataError(f"{name}: {what} ({actual['size']} bytes, {CHECKSUMS} records {expected['size']}); {AGAIN}")
    return DataError(
        f"{name}: sha256 {actual['sha256']} differs from the {CHECKSUMS} record ({expected['sha256']}): the file is "
        f"corrupt; {AGAIN}"
    )


def verify(
    directory: Path, *, skip: Collection[str] = (), rank: int = 0, world_size: int = 1
) -> dict[str, Record] | None:
    """Check a checkpoint's files against its checksums.json before they are read: each listed file but `skip`
    (the optimizer state when only weights are loaded) must have its recorded size and SHA-256. With several
    ranks each hashes its share (the files dealt out largest first to the least loaded rank: one shard each when
    every rank saved one), so the checkpoint is read once in all, not once per rank. Returns the record, or None
    (and rank 0 warns) when the checkpoint predates checksums."""
    files = read_checksums(directory)
    if files is None:
        if rank == 0:
            log.warning(
                "%s: no %s (saved before checksums were recorded): its files cannot be checked for corruption",
                directory,
                CHECKSUMS,
            )
        return None
    names = sorted(set(files) - set(skip))
    for name in names:  # sizes first, on every rank (cheap): a truncated file is named before any long hashing
        path = directory / name
        if path.is_file() and path.stat().st_size != files[name]["size"]:
            check_record(path, files[name])
    loads = [0] * world_size
    mine = []
    for name in sorted(names, key=lambda n: (-files[n]["size"], n)):
        least = loads.index(min(loads))
        loads[least] += files[name]["size"]
        if least == rank:
            mine.append(name)
    with progress_bar(desc="checksums", total=loads[rank], unit="B", leave=False, delay=1.0) as bar:
        for name in mine:
            check_record(directory / name, files[name])
            bar.update(files[name]["size"])
    return files


def require_listed(directory: Path, files: dict[str, Record], reads: Iterable[str]) -> None:
    """Every file a load reads must be one that checksums.json vouches for."""
    for name in reads:
        if name not in files:
            raise DataError(f"{directory / name}: not listed in {CHECKSUMS}, so it cannot be checked; {AGAIN}")


def write_checked(
    target: Path, expected: Record | None, label: str, fill: Callable[[Callable[[bytes], Any]], None]
) -> None:
    """Write `target` by `fill(write)` (a download giving its bytes in order), hashed as they pass, and refuse it
    under its `label` (its URL) unless they are the recorded ones: a refused file is removed, never kept, so a
    damaged download is neither used nor mistaken for a finished one later."""
    if expected is None:
        with open(target, "wb") as f:
            fill(f.write)
        return
    with hashing_open(target) as (stream, record):
        fill(stream.write)
    if record != expected:
        target.unlink(missing_ok=True)
        raise _differs(label, record, expected)
