"""`olmo-data index`: suffix arrays over a run's token files, so that `trace --text/--tokens/--spans` look a
passage up in O(length x log tokens) reads instead of scanning every token (the queries: `query`).

The token files are neither copied nor re-tokenized: an index stores suffix positions (uint32, 4 bytes a token)
into the existing file, and every 256th suffix's first 8 tokens (1/8 byte a token; 1/4 for uint32 tokens). Each
token file gets a folder
`suffix-index/NAME/` in its directory (or, with `index_dir`, `DIR/<digest>-NAME/`, for read-only data; never a name
tokenize's `part-*` patterns could match); `layout` names its files. A shard's suffixes are read up to
`window_end` = its end + context (or the file's end), so a passage crossing a shard's end is still found; the few
positions whose window is shorter than a long query are checked directly against the file, so answers stay exact
at any length. A shard's .json is written after its positions and keys, so a shard with a .json is complete.

Shards are built in bounded memory (about 80 bytes a token of a shard with numpy, 26 with divsufsort: the shard
size bounds it), in parallel over processes, and a rerun skips done shards; a token file changed since its index
was built makes queries refuse the index, and a rerun rebuilds only the shards whose window checksum changed. A
rerun that will rewrite shards (the file or the settings changed) deletes the manifest first, and queries check
that the shards cover the file exactly, so a rebuild cut short never answers from a mix of old and new shards.
Empty token files hold no match and get no index.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset import InstanceSource
from olmo_data.display import bar_disabled
from olmo_data.errors import DataError, is_disk_full
from olmo_data.io import (
    atomic_path,
    is_remote,
    remove_live_temporaries,
    remove_stale_temporaries,
    write_json_atomic,
)
from olmo_data.processes import pool_context
from olmo_data.suffix_index.integrity import file_matches, file_record
from olmo_data.suffix_index.layout import (
    CONTEXT,
    INDEX_VERSION,
    SHARD_TOKENS,
    file_stamp,
    index_folder,
    read_json_capped,
    read_manifest,
    shard_file,
    token_array,
)
from olmo_data.suffix_index.parts import (
    finish,
    mine,
    remove_beyond,
    window_hash,
    write_plan,
)
from olmo_data.suffix_index.search import SAMPLE_STEP, Samples
from olmo_data.suffix_index.sort import engine_name, openmp_started, suffix_array

SHARD_SUFFIXES = ("u32", "keys", "json")  # the files of a shard (`layout.shard_file`)


@dataclass(frozen=True)
class ShardTask:
    path: str
    dtype: str
    folder: str
    shard: int
    start: int
    end: int
    window_end: int
    engine: str
    keys_only: bool = False  # its positions hold (an index of format 1, or keys lost): only its keys are written


def _write_array(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Write an array's bytes atomically through a plain file write (numpy's tofile reports a full disk as 'N
    requested and M written', without the errno that says so) and return its checksums for the shard's record."""
    data = np.ascontiguousarray(array)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data.data.cast("B"))
    return file_record(data)


def _build_shard(task: ShardTask) -> int:
    """Sort one shard's suffixes (read up to its window's end) and write its positions, its sampled keys, then its
    .json with their checksums; a `keys_only` task (its positions checked by the caller) only gets its keys."""
    tokens = token_array(task.path, task.dtype)
    folder = Path(task.folder)
    record_path = shard_file(folder, task.shard, "json")
    if task.keys_only:
        positions = np.fromfile(shard_file(folder, task.shard, "u32"), dtype="<u4")
        record = read_json_capped(record_path)
    else:
        window = np.asarray(tokens[task.start : task.window_end])
        order = suffix_array(window, task.engine)
        positions = order[order < task.end - task.start].astype("<u4")
        del order
        record = {
            "start": task.start,
            "end": task.end,
            "window_end": task.window_end,
            "window_hash": window_hash(tokens, task.start, task.window_end),
            "engine": task.engine,
            "positions": _write_array(shard_file(folder, task.shard, "u32"), positions),
        }
    keys = Samples.of(tokens, positions, task.start, task.window_end).keys
    record["keys"] = _write_array(shard_file(folder, task.shard, "keys"), keys)
    write_json_atomic(record_path, record)
    return task.end - task.start


def _record(task: ShardTask) -> dict[str, Any] | None:
    try:  # a damaged record (cut short, edited, huge) is a shard to build again
        meta = read_json_capped(shard_file(Path(task.folder), task.shard, "json"))
    except (OSError, ValueError, DataError):
        return None
    return meta if isinstance(meta, dict) else None


def _sorted_current(task: ShardTask, tokens: np.ndarray, trust: bool) -> bool:
    """Whether the shard's record and positions are there, of its range, hold every byte its build wrote (read
    whole: 4 bytes a token), and (unless `trust`ed) are sorted from the tokens its window holds now: its keys
    aside."""
    meta = _record(task)
    try:
        if meta is None or (meta["start"], meta["end"], meta["window_end"]) != (task.start, task.end, task.window_end):
            return False
        if not file_matches(shard_file(Path(task.folder), task.shard, "u32"), meta, "positions"):
            return False
        return trust or meta["window_hash"] == window_hash(tokens, task.start, task.window_end)
    except (TypeError, KeyError):
        return False


def _keys_written(task: ShardTask, tokens: np.ndarray) -> bool:
    keys = shard_file(Path(task.folder), task.shard, "keys")
    want = -(-(task.end - task.start) // SAMPLE_STEP) * Samples.key_bytes(tokens.dtype.itemsize)
    meta = _record(task)
    return meta is not None and keys.exists() and keys.stat().st_size == want and file_matches(keys, meta, "keys")


def _shard_done(task: ShardTask, tokens: np.ndarray, trust: bool) -> bool:
    return _keys_written(task, tokens) and _sorted_current(task, tokens, trust)


@dataclass
class IndexSummary:
    files: int
    tokens: int
    shards: int
    built: int  # shards sorted by this run (the rest were done already)
    built_tokens: int
    seconds: float
    index_bytes: int
    engine: str
    messages: list[str]
    pending: int = 0  # with a part: shards other machines have not finished (no manifest for their files yet)

    @property
    def bytes_per_token(self) -> float:
        return self.index_bytes / max(self.tokens, 1)


def build_index(
    source: InstanceSource,
    *,
    index_dir: str | None = None,
    shard_tokens: int = SHARD_TOKENS,
    context: int = CONTEXT,
    processes: int = 1,
    engine: str = "auto",
    progress: bool | None = None,
    part: tuple[int, int] | None = None,
) -> IndexSummary:
    """Index every distinct token file of `source`; shards already done (and still matching their file) are kept.
    A full disk is one line naming where the index goes; the shards done so far are kept for the rerun. With
    `part` (I, N), sort only this machine's share of the shards (suffix_index/parts.py)."""
    try:
        return _build_index(source, index_dir, shard_tokens, context, processes, engine, progress, part)
    except OSError as e:
        if not is_disk_full(e):
            raise
        remove_live_temporaries()
        where = index_dir or "the suffix-index folders beside the token files"
        raise DataError(f"{where}: the disk is full ({e}); free space there and rerun (done shards are kept)") from e


def _build_index(
    source: InstanceSource,
    index_dir: str | None,
    shard_tokens: int,
    context: int,
    processes: int,
    engine: str,
    progress: bool | None,
    part: tuple[int, int] | None = None,
) -> IndexSummary:
    if shard_tokens < 1 or context < 1 or shard_tokens + context >= 1 << 32:
        raise DataError(f"shard_tokens {shard_tokens} and context {context}: expected positive, summing below 2**32")
    engine = engine_name(engine)
    files = {f.path: f for f in source.files}
    tasks: list[ShardTask] = []
    manifests: dict[str, dict[str, Any]] = {}
    messages: list[str] = []
    skipped, numbered = 0, 0
    every: dict[str, tuple[list[ShardTask], bool]] = {}  # each file's shards, and whether its old manifest holds
    for path, f in files.items():
        if is_remote(path):
            raise DataError(f"{path}: indexing reads whole token files; copy the token files here first")
        if f.num_tokens == 0:  # holds no match; a memory map of it cannot even be opened
            continue
        folder = index_folder(path, index_dir)
        stamp = file_stamp(path)
        try:
            old = read_manifest(folder)
        except DataError as e:  # unreadable: rebuilt, as a manifest of other settings is
            messages.append(f"{e.args[0].split(';')[0]}: rebuilding the index")
            (folder / "manifest.json").unlink()
            old = None
        settings = {
            "version": INDEX_VERSION,
            "dtype": f.dtype,
            "shard_tokens": shard_tokens,
            "context": context,
            "sample_step": SAMPLE_STEP,
        }
        trust = old is not None and old.get("stamp") == stamp and all(old.get(k) == v for k, v in settings.items())
        if old is not None and not trust:  # shards are about to change: no manifest may vouch for a mix of them
            if old.get("stamp") != stamp:
                messages.append(f"{path} changed since its index was built: rebuilding the shards it changed")
            elif old.get("version") != INDEX_VERSION:
                messages.append(
                    f"{path}: its index is in format {old.get('version')}: sorting its shards again to record the "
                    f"checksums of their files (format {INDEX_VERSION})"
                )
            (folder / "manifest.json").unlink()
        folder.mkdir(parents=True, exist_ok=True)
        tokens = token_array(path, f.dtype)
        n = len(tokens)
        shards = [
            ShardTask(
                path, f.dtype, str(folder), k, a, min(a + shard_tokens, n), min(a + shard_tokens + context, n), engine
            )
            for k, a in enumerate(range(0, n, shard_tokens))
        ]
        remove_beyond(folder, len(shards))
        owned = mine(shards, numbered, part)
        # a shard cut off mid-write by a killed build; with --shard only this machine's shards' temporaries, since
        # the other machines of the build may be writing theirs in this folder now
        ours = None if part is None else [shard_file(folder, t.shard, s).name for t in owned for s in SHARD_SUFFIXES]
        remove_stale_temporaries(folder, of=ours)
        if part is not None and not trust:
            write_plan(folder, numbered, len(shards), part[1])
        for task in owned:
            current = _sorted_current(task, tokens, trust)  # the window's checksum read once a shard
            if current and _keys_written(task, tokens):
                skipped += 1
            else:
                tasks.append(dataclasses.replace(task, keys_only=current))
        numbered += len(shards)
        every[path] = (shards, trust)
        manifests[path] = {
            **settings,
            "token_file": os.path.abspath(path),
            "num_tokens": n,
            "stamp": stamp,
            "shards": len(shards),
        }
    from tqdm import tqdm

    t0 = time.perf_counter()
    built_tokens = sum(t.end - t.start for t in tasks)
    with tqdm(total=built_tokens, unit=" tokens", unit_scale=True, desc="index", disable=bar_disabled(progress)) as bar:
        if processes <= 1 or len(tasks) <= 1:
            for task in tasks:
                bar.update(_build_shard(task))
        else:
            from olmo_data.interrupts import quiet_worker

            ctx = multiprocessing.get_context("spawn") if openmp_started() else pool_context()
            with ctx.Pool(min(processes, len(tasks)), initializer=quiet_worker) as pool:
                for done in pool.imap_unordered(_build_shard, tasks):
                    bar.update(done)
    seconds = time.perf_counter() - t0
    index_bytes, pending = 0, 0
    for path, manifest in manifests.items():
        folder = index_folder(path, index_dir)
        if part is None:
            write_json_atomic(folder / "manifest.json", manifest)
        else:  # every shard checked (other machines' too) before a manifest vouches for them
            shards, trust = every[path]
            check = functools.partial(_shard_done, tokens=token_array(path, manifest["dtype"]), trust=trust)
            pending += finish(folder, manifest, shards, check)
        index_bytes += sum(p.stat().st_size for p in folder.iterdir())
    return IndexSummary(
        files=len(files),
        tokens=sum(m["num_tokens"] for m in manifests.values()),
        shards=len(tasks) + skipped,
        built=len(tasks),
        built_tokens=built_tokens,
        seconds=seconds,
        index_bytes=index_bytes,
        engine=engine,
        messages=messages,
        pending=pending,
    )
