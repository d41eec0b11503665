"""Where a token file's suffix index lives and what its files are: shared by the build (`index`) and the
queries (`query`), so that neither imports the other.

A token file's folder holds, per shard k (positions [start, end) of the file):

  shard-KKKKK.u32   the positions, relative to start, sorted by their suffix (4 bytes a token)
  shard-KKKKK.keys  the first 8 tokens (Samples.WIDTH) of every SAMPLE_STEP-th of those suffixes, as big-endian
                    codes (search.Samples): a query memory-maps it and brackets its binary search with one
                    np.searchsorted, so a fresh process reads a few pages of it instead of sampling the shard
  shard-KKKKK.json  its range and window checksum, written last: a shard with a .json is complete

and `manifest.json`, written once every shard is.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset import DTYPES
from olmo_data.errors import DataError, shown

INDEX_VERSION = 2  # 2: every shard has its sampled keys (shard-KKKKK.keys)
SHARD_TOKENS = 1 << 26  # positions per shard: ~1.7 GB peak per divsufsort process (~5.3 GB with numpy's)
CONTEXT = 4096  # tokens a shard's suffixes are sorted by beyond its end
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 1 << 12
WILL_READ = 1 << 12  # positions read in one go from which the pages are asked for at once (16 KB)


def shard_file(folder: Path, k: int, suffix: str) -> Path:
    """shard-KKKKK.u32, .keys or .json of a folder."""
    return folder / f"shard-{k:05d}.{suffix}"


def index_folder(token_path: str, index_dir: str | None = None) -> Path:
    """Where the index of a token file lives: beside it, or in `index_dir` under a name that keeps two files of
    the same name apart."""
    if index_dir is None:
        return Path(token_path).parent / "suffix-index" / Path(token_path).name
    digest = hashlib.sha256(os.path.abspath(token_path).encode()).hexdigest()[:12]
    return Path(index_dir) / f"{digest}-{Path(token_path).name}"


def file_stamp(path: str) -> dict[str, Any]:
    """Size, modification time and a checksum of 16 evenly spaced 4 KiB blocks (the whole of a file under 64 KiB):
    cheap enough for every query (64 KiB read a file), and a second check where a rewrite keeps the size."""
    st = os.stat(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if st.st_size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            h.update(f.read())
        else:
            step = (st.st_size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)
            for k in range(SAMPLE_BLOCKS):
                f.seek(k * step)
                h.update(f.read(SAMPLE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": h.hexdigest()}


def token_array(path: str, dtype: str) -> np.ndarray:
    """A token file as a read-only memory map."""
    return np.memmap(path, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<"), mode="r")


def random_access(array: np.ndarray) -> np.ndarray:
    """A memory map that a query reads at random (a binary search's positions and tokens): told so, the kernel
    reads only the page a lookup touches instead of reading ahead around it, which from a cold page cache is most
    of a fresh process's time. A plain view of it is returned: cheaper to index than the memmap subclass."""
    raw = getattr(array, "_mmap", None)
    if raw is not None and hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    return np.asarray(array)


def will_read(array: np.ndarray, lo: int, hi: int) -> None:
    """Before reading array[lo:hi] of a `random_access` map in one go (the places of a frequent sequence): ask the
    kernel for those pages at once, as its read-ahead would have, instead of one page a fault."""
    base: Any = array
    while base is not None and getattr(base, "_mmap", None) is None:
        base = getattr(base, "base", None)  # an array's owner; bytes or an mmap end the walk
    if hi - lo < WILL_READ or base is None or not hasattr(mmap, "MADV_WILLNEED"):
        return
    start = array.ctypes.data - base.ctypes.data + lo * array.itemsize  # bytes into the map (its offset is 0)
    first = start - start % mmap.PAGESIZE
    base._mmap.madvise(mmap.MADV_WILLNEED, first, start + (hi - lo) * array.itemsize - first)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A folder's manifest.json (None when there is none); a damaged one is one line naming it."""
    try:
        data: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DataError(f"{folder / 'manifest.json'}: not valid JSON ({e}); delete the folder and rerun index") from e
    shards = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
        what = "not a JSON object" if not isinstance(data, dict) else f'"shards" is {shown(shards)}, not a count'
        raise DataError(f"{folder / 'manifest.json'}: {what}; delete the folder and rerun index")
    return data
