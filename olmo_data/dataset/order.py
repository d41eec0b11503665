"""Data orders: which instances each training step reads, OLMo's way, built once and stored.

Semantics (identical to OLMo's, so its published `global_indices.npy` files work here and ours work there):

* The order of epoch `e` (0-based) over `N` instances is `np.arange(N)` shuffled in place by
  `np.random.Generator(np.random.PCG64(seed + e))`, stored headerless as uint32 (uint64 from 2**32 instances
  on). Epoch 0 is `train_data/global_indices.npy`, epoch e > 0 is `train_data/global_indices_epoch{e}.npy`.
* Batch `b` of an epoch (0-based) is `order[b*GBS:(b+1)*GBS]`; an epoch has `N // GBS` batches (the tail that
does
  not fill a batch is dropped). Training step `s` (1-based) trains global batch `s - 1`, counted across
  epochs: epoch = (s - 1) // batches_per_epoch, batch in epoch = (s - 1) % batches_per_epoch.
* Rank `r` of a world of `W` takes positions r, r+W, r+2W, ... of the global batch; W must divide GBS.

The order never depends on the world size (OLMo pads the order to a multiple of the world size; cutting
batches by the global batch size makes that unnecessary, and OLMo's padded file is a prefix-compatible
superset of ours).

Each order we write has a side file `global_indices[_epochE].json` with num_instances, seed, epoch, dtype and
the data fingerprint (`InstanceSource.fingerprint()`), so an order is never silently used with other data. It
is written before the order itself, and both atomically, so an order file that exists is always complete.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from olmo_data import __version__
from olmo_data.config import TrainConfig, read_run_config
from olmo_data.dataset.instances import InstanceSource, open_from_config
from olmo_data.dataset.manifest import is_not_found_error
from olmo_data.dataset.steps import batches_per_epoch, step_position
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, cached_download, file_size, is_remote, read_bytes, write_json_atomic
from olmo_data.remote import remote_reader

log = logging.getLogger(__name__)

ORDER_FORMAT = "olmo-data.order"
ORDER_VERSION = 1
TRAIN_DATA_DIR = "train_data"


def order_dtype(num_instances: int) -> np.dtype[Any]:
    """uint32, as OLMo writes, unless the instance numbers do not fit."""
    return np.dtype(np.uint32) if num_instances < 2**32 else np.dtype(np.uint64)


FAST_SHUFFLE_MAX_BYTES = 4 * 2**30  # above this, shuffle the stored dtype in place to bound memory


def build_order(num_instances: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The permutation of `range(num_instances)` for (seed, epoch): bit-identical to OLMo's global indices.

    The permutation depends only on the length and the generator, not on the array's dtype. numpy swaps
    pointer-sized items with a specialised loop and other sizes with memcpy, so shuffling int64 and casting is
    about twice as fast as shuffling uint32 as OLMo does (measured: 20M instances, 1.6 s against 3.6 s); that
    needs 12 bytes per instance at the peak, so very large orders are shuffled in their stored dtype instead.
    """
    if num_instances < 0:
        raise DataError(f"num_instances must be >= 0, got {num_instances}")
    if seed + epoch < 0:
        raise DataError(f"seed + epoch must be >= 0 for PCG64, got seed={seed}, epoch={epoch}")
    rng = np.random.Generator(np.random.PCG64(seed + epoch))
    dtype = order_dtype(num_instances)
    if num_instances * (8 + dtype.itemsize) <= FAST_SHUFFLE_MAX_BYTES:
        order = np.arange(num_instances, dtype=np.intp)
        rng.shuffle(order)
        return order.astype(dtype)
    order = np.arange(num_instances, dtype=dtype)
    rng.shuffle(order)
    return order


def order_file_name(epoch: int) -> str:
    return "global_indices.npy" if epoch == 0 else f"global_indices_epoch{epoch}.npy"


def order_path_for_epoch(location: str, epoch: int) -> str:
    """The order file of `epoch`, given a directory (`save_folder/train_data`) or the explicit epoch-0 file.

    For an explicit file `X.npy`, epoch e > 0 is `X_epoch{e}.npy` beside it, mirroring the default names.
    """
    location = str(location)
    if location.endswith(".npy"):
        if epoch == 0:
            return location
        return f"{location[: -len('.npy')]}_epoch{epoch}.npy"
    return f"{location.rstrip('/')}/{order_file_name(epoch)}"


def side_file(order_path: str) -> str:
    """`global_indices.npy` -> `global_indices.json`: where the order's description lives."""
    order_path = str(order_path)
    return (order_path[: -len(".npy")] if order_path.endswith(".npy") else order_path) + ".json"


@functools.lru_cache(maxsize=64)
def _read_local_json(path: str, mtime_ns: int, size: int) -> Any:
    with open(path) as f:
        return json.load(f)


def read_order_info(order_path: str) -> dict[str, Any] | None:
    """The side file of an order, or None for an order without one (for example one that OLMo wrote)."""
    path = side_file(order_path)
    if not is_remote(path) and not os.path.exists(path):
        return None
    try:
        if is_remote(path):
            info = json.loads(read_bytes(path))
        else:  # the trainer asks every step: parse a local side file once per version of it
            st = os.stat(path)
            info = _read_local_json(path, st.st_mtime_ns, st.st_size)
    except DataError as e:
        if is_remote(path) and is_not_found_error(e):
            return None
        raise  # a network failure must not pass for "no side file": that would skip every check
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e}); delete it and the order beside it and rebuild") from e
    if not isinstance(info, dict) or info.get("format") != ORDER_FORMAT:
        raise DataError(f"{path}: not an olmo-data order description (format != {ORDER_FORMAT!r})")
    return dict(info)  # a copy: the cached one must not change


def write_order(
    order_path: str,
    order: np.ndarray,
    *,
    seed: int,
    epoch: int,
    source: InstanceSource | None = None,
) -> str:
    """Write an order and its side file atomically (side file first, so an existing order is always
    complete)."""
    info: dict[str, Any] = {
        "format": ORDER_FORMAT,
        "version": ORDER_VERSION,
        "tool_version": __version__,
        "num_instances": int(len(order)),
        "seed": int(seed),
        "epoch": int(epoch),
        "dtype": str(order.dtype),
        "permutation": "np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(np.arange(num_instances))",
    }
    if source is not None:
        info["data_fingerprint"] = source.fingerprint()
        info["sequence_length"] = source.sequence_length
        info["data"] = source.describe()
    write_json_atomic(side_file(order_path), info)
    with atomic_path(order_path) as tmp:
        np.ascontiguousarray(order, dtype=order.dtype.newbyteorder("<")).tofile(tmp)
    return str(order_path)


def _check_matches(
    order_path: str, info: dict[str, Any] | None, source: InstanceSource, seed: int | None, epoch: int | None
) -> None:
    n = len(source)
    if info is None:  # OLMo's: no side file, so its length says what it was built for
        size = file_size(order_path)
        length = size // 4
        if size % 4 or length >= 2 * n:
            raise DataError(
                f"{order_path}: {size} bytes is not an order of {n} uint32 instance numbers (truncated to whole "
                "batches, or padded with its own first entries, as OLMo writes them); it was built for other "
                "data. Delete it to rebuild, or fix data.paths"
            )
        if length > n:
            _check_padding(order_path, n, length)
        return
    fp = info.get("data_fingerprint")
    if fp is not None and fp != source.fingerprint():
        recorded = info.get("data", {})
        now = source.describe()
        what = []
        if recorded.get("sequence_length") != now["sequence_length"]:
            what.append(f"sequence length {recorded.get('sequence_length')} -> {now['sequence_length']}")
        old_files = {tuple(f[:2]) for f in recorded.get("files", [])}
        new_files = {tuple(f[:2]) for f in now["files"]}
        if old_files != new_files:
            gone = sorted(p for p, _ in old_files - new_files)
            added = sorted(p for p, _ in new_files - old_files)
            what.append(f"files no longer as recorded: {gone[:3]}; new or changed: {added[:3]}")
        elif [f[0] for f in recorded.get("files", [])] != [f[0] for f in now["files"]]:
            what.append("the same files in another order")
        if recorded.get("mix") != now["mix"]:
            what.append("the mix changed")
        raise DataError(
            f"{order_path}: this order was built for other data (data fingerprint {fp}, now "
            f"{source.fingerprint()}: {'; '.join(what) or 'files or dtypes differ'}). The data paths changed since "
            "the order was built: restore them, or use a new save_folder (or data.order_path) to build a new "
            "order; if the same files only moved, the trainer's force_load keeps the order"
        )
    if int(info["num_instances"]) != n:
        raise DataError(
            f"{order_path}: the order has {info['num_instances']} instances but the data has {n}; rebuild the order"
        )
    for key, want in (("seed", seed), ("epoch", epoch)):
        if want is not None and int(info[key]) != int(want):
            raise DataError(
                f"{order_path}: the order was built with {key}={info[key]}, but {key}={want} was asked for; "
                "use the original seed or a new save_folder"
            )


def _check_padding(order_path: str, n: int, length: int) -> None:
    """OLMo (`drop_last: false`, its default) pads an order to a multiple of the world size by repeating its
    first entries: the tail past `n` must be the head. Anything else is an order of other data."""
    extra = length - n
    tail = read_order_range(order_path, n, length, num_instances=n)
    head = read_order_range(order_path, 0, extra, num_instances=n)
    if not np.array_equal(tail, head):
        raise DataError(
            f"{order_path}: {length} instance numbers for {n} instances, but its last {extra} are not its first "
            f"{extra} (OLMo pads an order with its own head): it was built for other data. Delete it to rebuild, "
            "or fix data.paths"
        )


def ensure_order(train_data_dir: str, source: InstanceSource, seed: int, epoch: int = 0) -> str:
    """The path of epoch `epoch`'s order for `source` in `train_data_dir`, building it if it does not exist.

    An existing order is reused only if its side file says it was built for the same data (fingerprint), seed
    and epoch; otherwise this raises DataError rather than train on an order that names other instances. An
    order without a side file (OLMo's) is accepted when its length fits the data: at most the instance count
    (OLMo's `drop_last: true`), or more, padded with its own first entries (its default). Safe to call from many
    processes at once: they write identical bytes to temporary names and rename.
    `train_data_dir` may also be an explicit epoch-0 order file path (`data.order_path`).
    """
    path = order_path_for_epoch(train_data_dir, epoch)
    if is_remote(path):
        if read_order_info(path) is None and not _remote_exists(path):
            raise DataError(f"{path}: order file not found, and orders can only be built on local disk")
        _check_matches(path, read_order_info(path), source, seed, epoch)
        return path
    if os.path.exists(path):
        _check_matches(path, read_order_info(path), source, seed, epoch)
        return path
    log.info("building the data order of epoch %d over %d instances: %s", epoch, len(source), path)
    return write_order(path, build_order(len(source), seed, epoch), seed=seed, epoch=epoch, source=source)


def _remote_exists(path: str) -> bool:
    try:
        file_size(path)
        return True
    except Exception:
        return False


def load_order(
    path: str, expected_fingerprint: str | None = None, *, seed: int | None = None, epoch: int | None = None
) -> np.ndarray:
    """The order at `path` as a read-only memory map (remote orders are fetched once into the local cache).

    With `expected_fingerprint`, an order whose side file records another data fingerprint is refused; with
    `seed` / `epoch`, one whose side file records another seed or epoch.
    """
    path = str(path)
    info = _checked_info(path, expected_fingerprint, seed=seed, epoch=epoch)
    dtype = _stored_dtype(path, info, np.dtype(np.uint32))
    local = path
    if is_remote(path):  # the side file says which order it is (fingerprint, seed, epoch): a rebuilt one is new
        try:
            local = str(cached_download(path, json.dumps(info, sort_keys=True) if info else ""))
        except DataError as e:
            raise DataError(f"cannot fetch the order file: {e}") from e
    elif not os.path.exists(path):
        raise DataError(f"{path}: order file not found; build it with `olmo-data build-order` or check the path")
    if _checked_length(path, info, dtype, os.path.getsize(local)) == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(local, dtype=dtype.newbyteorder("<"), mode="r")


def _stored_dtype(path: str, info: dict[str, Any] | None, default: np.dtype[Any]) -> np.dtype[Any]:
    """The order's entry type as its side file states it, which must be one an order is written in: any other
    (a float, a narrower int) would read every entry as another instance without a word."""
    if not info:
        return default
    name = info.get("dtype")
    if name not in ("uint32", "uint64"):
        raise DataError(
            f"{side_file(path)}: dtype {name!r}; an order holds uint32 (or, past 2**32 instances, "
            "uint64) entries. The side file is damaged: build the order again"
        )
    return np.dtype(str(name))


def _checked_length(path: str, info: dict[str, Any] | None, dtype: np.dtype[Any], size: int) -> int:
    """The number of entries in an order file of `size` bytes, which must be the count its side file records."""
    length = size // dtype.itemsize
    if info and "num_instances" in info and int(info["num_instances"]) != length:
        raise DataError(
            f"{path}: holds {length:,} entries of {dtype}, but its side file records {int(info['num_instances']):,}; "
            "the order or its side file is damaged: build the order again"
        )
    return length


def _checked_info(
    path: str, expected_fingerprint: str | None, *, seed: int | None = None, epoch: int | None = None
) -> dict[str, Any] | None:
    """The order's side file, refusing one built for other data, another seed or another epoch: any of these
    names other instances at every step, so reading on would silently report (or train) the wrong batches."""
    info = read_order_info(path)
    if info is not None and seed is not None and "seed" in info and int(info["seed"]) != int(seed):
        raise DataError(
            f"{path}: this order was built with seed {info['seed']}, but the config's seed is {seed}; it is not "
            f"this run's order: set seed: {info['seed']} in the config, or point data.order_path / --order at "
            "the order built with this seed (`olmo-data build-order CONFIG` builds one in a new save_folder)"
        )
    if info is not None and epoch is not None and "epoch" in info and int(info["epoch"]) != int(epoch):
        raise DataError(
            f"{path}: this order was built for epoch {info['epoch']}, but it is read as the order of epoch "
            f"{epoch}; check the file names (epoch e > 0 is global_indices_epoch<e>.npy)"
        )
    if info is not None and expected_fingerprint is not None:
        fp = info.get("data_fingerprint")
        if fp is not None and fp != expected_fingerprint:
            raise DataError(
                f"{path}: this order was built for other data (data fingerprint {fp}, expected "
                f"{expected_fingerprint}); the data paths changed since the order was built: restore them, or "
                "build a new order in a new save_folder; if the same files only moved, inspect-batch "
                "--no-verify-data reads the order anyway (then compare the batch fingerprint with the run's)"
            )
    return info


def read_order_range(
    path: str,
    start: int,
    stop: int,
    *,
    expected_fingerprint: str | None = None,
    num_instances: int | None = None,
    seed: int | None = None,
    epoch: int | None = None,
) -> np.ndarray:
    """order[start:stop] without reading the whole order: a memory-map slice locally, one ranged read
    remotely.

    Raises DataError when the order file is missing or shorter than `stop`, or when its side file records
    another data fingerprint, seed or epoch than the ones given. `num_instances` picks the dtype of an order
    without a side file (uint32 unless there are 2**32 instances or more).
    """
    path = str(path)
    if not is_remote(path) and not os.path.exists(path):
        raise DataError(
            f"{path}: order file not found; build it with `olmo-data build-order CONFIG` (or train once), "
            "or set "
            "data.order_path to the order file"
        )
    info = _checked_info(path, expected_fingerprint, seed=seed, epoch=epoch)
    dtype = _stored_dtype(path, info, order_dtype(num_instances or 0))
    try:
        size = file_size(path)
    except Exception as e:
        raise DataError(f"{path}: order file not found or unreadable ({type(e).__name__}: {e})") from e
    length = _checked_length(path, info, dtype, size)
    if stop > length:
        raise DataError(
            f"{path}: the order holds {length} instances, fewer than the {stop} needed; the step is past "
            "the end "
            "of the order"
        )
    if is_remote(path):
        raw = remote_reader().read(path, start * dtype.itemsize, (stop - start) * dtype.itemsize)
    else:
        with open(path, "rb") as f:  # a positioned read: no read-ahead around a slice of a large order
            f.seek(start * dtype.itemsize)
            raw = f.read((stop - start) * dtype.itemsize)
    out = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).copy()
    if num_instances is not None:
        check_order_entries(path, out, start, num_instances)
    return out


def check_order_entries(
    path: str, entries: np.ndarray, start: int, num_instances: int, seen: np.ndarray | None = None
) -> None:
    """Entries `start ..` of the order file `path` are instances of the data (below `num_instances`), none twice
    (a slice of a permutation): a file of another dtype, zeroed or damaged bytes, or an order of other data with
    the same length is refused here, naming the file and the entry, before any instance is read from it. With
    `seen` (one bool per instance: those of the blocks checked before), none of earlier blocks either; marked."""
    if not entries.size:
        return
    problem = None
    if int(entries.max()) >= num_instances:
        i = int(np.argmax(entries >= num_instances))
        problem = f"entry {start + i:,} is instance {int(entries[i]):,}, past the data's {num_instances:,} instances"
    else:
        earlier = np.flatnonzero(seen[entries])[:1].tolist() if seen is not None else []
        repeats = [r for r in (_first_repeat(entries, num_instances), *earlier) if r is not None]
        if repeats:
            repeat = min(repeats)
            problem = f"entry {start + repeat:,} is instance {int(entries[repeat]):,} again"
    if problem is not None:
        raise DataError(
            f"{path}: {problem}; an order holds each instance once: the file is damaged, of another dtype, or built "
            "for other data. Delete it to rebuild it (`olmo-data build-order CONFIG`), or fix data.paths"
        )
    if seen is not None:
        seen[entries] = True


CHECK_BLOCK = 1 << 24  # entries: up to this many are checked by one sort, more against one byte per instance


def _first_repeat(entries: np.ndarray, num_instances: int) -> int | None:
    """The position of the first entry that repeats an earlier one, or None. A batch's slice is sorted; a whole
    epoch (730M entries at OLMo 3's scale, where a sort of int64 copies would hold ~30 GB) is checked against one
    byte per instance, a block at a time (a block is sorted only to name the entry that repeats)."""
    if entries.size <= CHECK_BLOCK:
        _, first = np.unique(entries, return_index=True)
        if len(first) == len(entries):
            return None
        return int(np.setdiff1d(np.arange(len(entries)), first, assume_unique=True)[0])
    seen, marked = np.zeros(num_instances, dtype=bool), 0
    for lo in range(0, entries.size, CHECK_BLOCK):
        block = np.asarray(entries[lo : lo + CHECK_BLOCK])
        again = np.flatnonzero(seen[block])
        if again.size:  # an instance of an earlier block, unless the block repeats one of its own before it
            inside = _first_repeat(block[: int(again[0])], num_instances)
            return lo + (int(again[0]) if inside is None else inside)
        seen[block] = True
        now = int(np.count_nonzero(seen))
        if now - marked != len(block):  # fewer instances marked than entries: the block repeats one of its own
            return lo + (_first_repeat(block, num_instances) or 0)
        marked = now
    return None


def global_batch_indices(
    order_location: str,
    step: int,
    global_batch_size: int,
    *,
    num_instances: int,
    expected_fingerprint: str | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """Instance indices of training step `step`'s global batch, read from the order of the step's epoch.

    `order_location` is the `train_data` directory or an explicit epoch-0 order file (local path or URL). Only
    the batch's slice is read. A missing epoch order or a step past its end raises DataError naming the file,
    and so does an order whose side file records another data fingerprint or seed than the ones given.
    """
    pos = step_position(step, global_batch_size, num_instances)
    path = order_path_for_epoch(order_location, pos.epoch)
    start, stop = pos.order_range(global_batch_size)
    if not is_remote(path) and not os.path.exists(path):
        raise DataError(
            f"{path}: order file not found (step {step} is batch {pos.batch_in_epoch} of epoch {pos.epoch}, "
            f"{pos.batches_per_epoch} batches per epoch); build it with "
            f"`olmo-data build-order CONFIG --first-epoch {pos.epoch}` or check save_folder / data.order_path"
        )
    try:
        return read_order_range(
            path,
            start,
            stop,
            expected_fingerprint=expected_fingerprint,
            num_instances=num_instances,
            seed=seed,
            epoch=pos.epoch,
        )
    except DataError as e:
        if "past the end" in str(e):
            raise DataError(f"step {step} is past the end of the order: {e}") from e
        raise


COMPARE_ENTRIES = 1 << 22  # entries of an existing order compared at a time (16 MiB of uint32)


def first_difference(stored: np.ndarray, want: np.ndarray) -> int | None:
    """The first entry of their common length where `stored` (an order file's memory map) and `want` differ,
    or None: compared a block at a time, so that a large order is never read whole into memory. Both trainers'
    `build-order` check an order already there with it."""
    count = min(len(stored), len(want))
    for lo in range(0, count, COMPARE_ENTRIES):
        hi = min(lo + COMPARE_ENTRIES, count)
        a, b = np.asarray(stored[lo:hi]), want[lo:hi]
        if not np.array_equal(a, b):
            return lo + int(np.argmax(a != b))
    return None


def check_order_content(path: str, want: np.ndarray) -> None:
    """An order file already there holds `want` (the permutation it was built as) in its first entries: the side
    file and the size say which data and how long, but not that the bytes are still the order's."""
    stored = load_order(path)
    at = first_difference(stored, want)
    if at is not None:
        raise DataError(
            f"{path}: entry {at:,} is instance {int(stored[at]):,}, but the order built for this data, seed and "
            f"epoch has {int(want[at]):,} there; the file is damaged or of another dtype: delete it (and its "
            ".json side file) and build again"
        )


def order_location(config: TrainConfig) -> str:
    """`data.order_path` if the config sets one, else `save_folder/train_data`, where the trainer puts it."""
    return config.data.order_path or default_order_location(config.save_folder)


def default_order_location(save_folder: str) -> str:
    """`save_folder/train_data`, where the trainer keeps its orders (OLMo's place for them)."""
    return f"{str(save_folder).rstrip('/')}/{TRAIN_DATA_DIR}"


@dataclass(frozen=True)
class OrderSummary:
    """What `olmo-data build-order` reports for one epoch's order."""

    path: str
    epoch: int
    num_instances: int
    dtype: str
    built: bool  # False: an existing order was checked and kept
    seconds: float
    global_batch_size: int
    batches_per_epoch: int
    dropped_instances: int  # the tail that does not fill a global batch

    def line(self) -> str:
        what = f"built in {self.seconds:.2f} s" if self.built else "already there, checked against the data"
        return (
            f"{self.path}: epoch {self.epoch}, {self.num_instances:,} instances ({self.dtype}), {what}; "
            f"{self.batches_per_epoch:,} batches of {self.global_batch_size} per epoch, "
            f"{self.dropped_instances:,} instances in the tail dropped"
        )


def build_config_orders(
    config: str | dict[str, Any] | TrainConfig,
    *,
    epochs: int = 1,
    first_epoch: int = 0,
    location: str | None = None,
) -> list[OrderSummary]:
    """Build (or check) the orders of epochs first_epoch .. first_epoch+epochs-1 for a training config (a path,
    its keys or a TrainConfig, read as the trainer reads it).

    `location` overrides `data.order_path` / `save_folder/train_data`. The data, seed and global batch size
    come from the config exactly as the trainer reads them, so the trainer then finds and accepts these
    orders.
    """
    import time

    config = read_run_config(config)
    if epochs < 1 or first_epoch < 0:
        raise DataError(f"--epochs must be >= 1 and --first-epoch >= 0, got {epochs} and {first_epoch}")
    source = open_from_config(config)
    where = location or order_location(config)
    gbs = config.global_train_batch_size
    n = len(source)
    per_epoch = batches_per_epoch(n, gbs)
    out = []
    for epoch in range(first_epoch, first_epoch + epochs):
        path = order_path_for_epoch(where, epoch)
        existed = is_remote(path) or os.path.exists(path)
        t0 = time.perf_counter()
        ensure_order(where, source, config.seed, epoch)
        if existed and not is_remote(path):  # kept only when it is the permutation, entry for entry
            check_order_content(path, build_order(n, config.seed, epoch))
        out.append(
            OrderSummary(
                path,
                epoch,
                n,
                str(order_dtype(n)),
                not existed,
                time.perf_counter() - t0,
                gbs,
                per_epoch,
                n - per_epoch * gbs,
            )
        )
    return out
