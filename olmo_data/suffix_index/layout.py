"""Where a token file's suffix index lives and what its files are: shared by the build (`index`) and the
queries (`query`), so that neither imports the other.

A token file's folder holds, per shard k (positions [start, end) of the file):

  shard-KKKKK.u32   the positions, relative to start, sorted by their suffix (4 bytes a token)
  shard-KKKKK.keys  the first 8 tokens (Samples.WIDTH) of every SAMPLE_STEP-th of those suffixes, as big-endian
                    codes (search.Samples): a query memory-maps it and brackets its binary search with one
                    np.searchsorted, so a fresh process reads a few pages of it instead of sampling the shard
  shard-KKKKK.json  its range, window checksum and the checksums of its positions and keys (`integrity`),
                    written last: a shard with a .json is complete

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

INDEX_VERSION = 3  # 2: every shard has its sampled keys (shard-KKKKK.keys); 3: its record has their checksums
RECORD_CAP = 1 << 20  # bytes read of a manifest, a shard record or a build plan at most: each is a few KiB
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
    """Size, modification and change times and a checksum of 16 evenly spaced 4 KiB blocks (the whole of a file
    under 64 KiB): cheap enough for every query (64 KiB read a file). The change time (ctime) is what catches a
    file rewritten in place with its mtime set back (`cp -p`, `rsync -t`, `tar x`): no user can set it back, and
    any write, utime or chmod moves it. A file whose ctime moved although its content did not (copied, touched)
    is refused too, until a rerun of `olmo-data index` checks its content against the shards' window checksums
    (a read of the file, no sort) and records its new stamp."""
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
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "sample": h.hexdigest()}


STAMP_PARTS = {
    "size": "its size",
    "mtime_ns": "its modification time",
    "ctime_ns": "its change time (ctime: rewritten, touched, copied or chmod-ed, whatever its mtime says)",
    "sample": "its sampled content",
}


def stamp_change(old: Any, new: dict[str, Any]) -> str:
    """What differs between a recorded stamp and the file's, in words."""
    old = old if isinstance(old, dict) else {}
    return ", ".join(words for k, words in STAMP_PARTS.items() if old.get(k) != new[k]) or "its stamp"


def read_json_capped(path: Path, cap: int = RECORD_CAP) -> Any:
    """A small JSON file of the index (a manifest, a shard record, a build plan), never read past `cap` bytes: a
    huge file under that name is refused by name instead of read whole into memory."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise DataError(
            f"{path}: over {cap:,} bytes, not a suffix index's record (a few KiB); delete the index folder and rerun "
            "`olmo-data index CONFIG`"
        )
    return json.loads(data)


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
        data: dict[str, Any] = read_json_capped(folder / "manifest.json")
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DataError(f"{folder / 'manifest.json'}: not valid JSON ({e}); delete the folder and rerun index") from e
    shards = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(shards, int) or isinstance(shards, bool) or shards < 0:
        what = "not a JSON object" if not isinstance(data, dict) else f'"shards" is {shown(shards)}, not a count'
        raise DataError(f"{folder / 'manifest.json'}: {what}; delete the folder and rerun index")
    return data
