"""A checkpoint given as a path or a URL, as a local directory whose files can be trusted to be the recorded ones.

A remote checkpoint is copied into a cache entry of its own ($OLMO_DATA_CACHE/checkpoints) through
`olmo_data.remote`, the reader the data path uses: its requests time out when a server stalls, are retried a
bounded number of times, follow a bounded number of redirects, and fail with one line naming the URL, so a
load never hangs. Every name is confined to the entry and every file checked against checksums.json while it is
downloaded, under a temporary name; only a complete, checked file gets its own name.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

from olmo_data.dataset import is_not_found_error
from olmo_data.errors import DataError
from olmo_data.io import default_cache_dir, is_remote
from olmo_data.remote import remote_reader
from olmo_train.checkpoint import integrity, safety
from olmo_train.checkpoint.layout import CHECKSUMS, CONFIG, DCP_METADATA, MODEL_FILE, OPTIM_FILE, TRAINER_STATE
from olmo_train.distributed import Dist, barrier

log = logging.getLogger(__name__)

# side files are read whole into memory once fetched: a server announcing (or sending) more is refused by URL
METADATA_MAX_BYTES = {CHECKSUMS: 64 * 2**20, TRAINER_STATE: 64 * 2**20, CONFIG: 64 * 2**20, DCP_METADATA: 2**30}


def localize(load_path: str, d: Dist) -> Path:
    """A local directory holding the checkpoint at `load_path` (remote ones downloaded into the cache)."""
    if not is_remote(load_path):
        path = Path(load_path).expanduser()
        if not path.is_dir():
            raise DataError(f"load_path {load_path}: no such checkpoint directory")
        safety.check_link(path)
        return path
    local: Path | None = None
    if d.local_rank == 0:
        local = download(load_path.rstrip("/"))
    barrier()
    if d.local_rank != 0:
        local = download(load_path.rstrip("/"))  # already in the cache: only resolves the paths
    assert local is not None
    return local


def cache_entry(url: str) -> Path:
    """Where the checkpoint at `url` is downloaded: a directory of its own, named by the URL's hash."""
    return Path(default_cache_dir()) / "checkpoints" / f"checkpoint-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def download(url: str) -> Path:
    """The checkpoint at `url`, copied into a cache entry of its own. Its checksums.json names the files to fetch
    (a checkpoint saved before it existed: its metadata does); each name is checked to stay inside the entry
    before anything is fetched or written, and each file against its record while it is downloaded, before it gets
    its name, so a damaged download is never used and a crafted one writes nowhere else."""
    reader = remote_reader()

    def place(name: str) -> None:
        target = safety.confined(dest, name, url)
        expected = records.get(name) if records else None
        if target.exists() and (expected is None or target.stat().st_size == expected["size"]):
            return  # a file is only ever complete under its own name: downloaded aside, checked, then renamed
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part-{os.getpid()}")
        try:
            # a failed download is the reader's DataError: one line that begins with the file's URL
            source = f"{url}/{name}"
            cap = expected["size"] if expected else METADATA_MAX_BYTES.get(name)  # no file larger than recorded
            fetch = functools.partial(reader.download, source, max_bytes=cap)
            integrity.write_checked(partial, expected, source, fetch)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def present(name: str) -> bool:
        """Whether the server has `name`: only "not found" is an absence; a stall or an outage is an error."""
        try:
            reader.size(f"{url}/{name}")
            return True
        except DataError as e:
            if is_not_found_error(e):
                return False
            raise

    dest = cache_entry(url)
    dest.mkdir(parents=True, exist_ok=True)
    records: dict[str, integrity.Record] | None = None
    if not present(TRAINER_STATE):
        raise DataError(f"load_path {url}: no {TRAINER_STATE} there; give the URL of a checkpoint directory")
    if present(CHECKSUMS):
        place(CHECKSUMS)
        records = integrity.read_checksums(dest)
    else:
        log.warning("%s: no %s (saved before checksums existed): the download cannot be checked", url, CHECKSUMS)
    if records is not None:
        names = sorted(records)
    else:  # checkpoints written before configs were saved in them have no config.yaml
        names = [TRAINER_STATE] + [CONFIG] * present(CONFIG)
        names += [MODEL_FILE, OPTIM_FILE] if present(MODEL_FILE) else [DCP_METADATA]
    if DCP_METADATA in names:  # sharded: the shard names are the metadata's, read safely, checked
        place(DCP_METADATA)
        shards = sorted(safety.storage_extents(safety.read_metadata(dest / DCP_METADATA)))
        if records is not None:
            integrity.require_listed(dest, records, shards)
        names += [name for name in shards if name not in names]
    for name in names:
        place(name)
    return dest
