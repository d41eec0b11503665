"""`olmo-data index --shard I/N`: one index built by N machines (or a Slurm array) sharing the index folders.

The shards of every token file of the run, numbered in the run's file order and then by position, are dealt out
round-robin: machine I sorts shards I, I + N, I + 2N, ... Each shard's three files depend only on the token file
and the settings, so which machine wrote them, and in what order the machines ran, changes no byte.

While shards are outstanding each index folder holds `build-plan.json` (the number of machines and the machine
each shard belongs to), written identically by every machine. Whichever machine finds every shard of a file done
writes its manifest (the same bytes a one-machine build writes) and removes the plan, so the finished folders are
the one-machine build's, file for file. A query that meets a plan names the shards still missing and the
`--shard I/N` that builds them, instead of answering from part of the data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from olmo_data.errors import DataError
from olmo_data.io import write_json_atomic
from olmo_data.suffix_index.layout import read_json_capped, shard_file

PLAN_FILE = "build-plan.json"
T = TypeVar("T")


def window_hash(tokens: np.ndarray, lo: int, hi: int) -> str:
    """The checksum of the tokens a shard is sorted by, kept in its .json: a rerun rebuilds a shard whose window
    changed."""
    return hashlib.blake2b(np.asarray(tokens[lo:hi]).tobytes(), digest_size=16).hexdigest()


def shard_current(folder: Path, tokens: np.ndarray, k: int) -> bool:
    """Whether shard k's record is there and its window still holds the tokens it was sorted by."""
    try:
        meta = read_json_capped(shard_file(folder, k, "json"))
        return bool(meta["window_hash"] == window_hash(tokens, int(meta["start"]), int(meta["window_end"])))
    except (OSError, ValueError, TypeError, KeyError, DataError):
        return False


def remove_beyond(folder: Path, shards: int) -> None:
    """Delete the shard files numbered `shards` or above: left by a build with smaller shards, they would hold disk
    (a manifest never names them)."""
    for path in folder.glob("shard-*.*"):
        number = path.name[len("shard-") :].split(".")[0]
        if number.isdigit() and int(number) >= shards:
            path.unlink(missing_ok=True)


def owners(first: int, shards: int, count: int) -> list[int]:
    """The machine of each of a file's shards, whose first shard is number `first` of the whole run."""
    return [(first + k) % count for k in range(shards)]


def mine(tasks: Sequence[T], first: int, part: tuple[int, int] | None) -> list[T]:
    """The shards (of one file, the first being number `first` of the run) this machine sorts: all without a part."""
    if part is None:
        return list(tasks)
    index, count = part
    return [t for k, t in enumerate(tasks) if (first + k) % count == index]


def write_plan(folder: Path, first: int, shards: int, count: int) -> None:
    """Record, before any shard is sorted, which machine owns which of this folder's shards."""
    write_json_atomic(folder / PLAN_FILE, {"machines": count, "owners": owners(first, shards, count)})


def finish(folder: Path, manifest: dict[str, Any], tasks: Sequence[T], done: Callable[[T], bool]) -> int:
    """Write the manifest and remove the plan when every shard of the file is done; else the shards outstanding."""
    outstanding = sum(1 for t in tasks if not done(t))
    if outstanding == 0:
        write_json_atomic(folder / "manifest.json", manifest)
        (folder / PLAN_FILE).unlink(missing_ok=True)
    return outstanding


def refuse_unfinished(folder: Path, token_path: str, tokens: np.ndarray) -> None:
    """A folder some machines of a `--shard` build have not finished: one line naming the shards still missing (or
    stale: their window no longer holds `tokens`) and the `--shard I/N` runs that build them. Nothing happens where
    no plan is left (one-machine builds)."""
    try:
        plan = read_json_capped(folder / PLAN_FILE)
        count, owner = int(plan["machines"]), [int(o) for o in plan["owners"]]
    except FileNotFoundError:
        return
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(f"{folder / PLAN_FILE}: unreadable ({e}); rerun every `olmo-data index --shard I/N`") from e
    missing = [k for k in range(len(owner)) if not shard_current(folder, tokens, k)]
    if not missing:
        missing_text = "every shard is written but no machine has checked them all"
        parts = sorted(set(owner))[:1]
    else:
        names = ", ".join(f"shard-{k:05d}" for k in missing[:5]) + (" ..." if len(missing) > 5 else "")
        missing_text = f"{len(missing)} of its {len(owner)} shards are missing or stale ({names})"
        parts = sorted({owner[k] for k in missing})
    runs = " and ".join(f"--shard {p}/{count}" for p in parts)
    raise DataError(
        f"{folder}: the suffix index of {token_path} is unfinished: {missing_text}; run `olmo-data index CONFIG "
        f"{runs}` (with the same settings), or trace with --no-index"
    )
