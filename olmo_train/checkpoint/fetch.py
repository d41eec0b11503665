"""A checkpoint given as a path or a URL, as a local directory whose files can be trusted to be the recorded ones.

A remote checkpoint is copied into a cache entry of its own through cached-path; every name is confined to that
entry and every file checked against checksums.json while it is copied, before it gets its name.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_train.checkpoint import integrity, safety
from olmo_train.checkpoint.layout import CHECKSUMS, CONFIG, DCP_METADATA, MODEL_FILE, OPTIM_FILE, TRAINER_STATE
from olmo_train.distributed import Dist, barrier

log = logging.getLogger(__name__)


def localize(load_path: str, d: Dist) -> Path:
    """A local directory holding the checkpoint at `load_path` (remote ones fetched through cached-path)."""
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


def download(url: str) -> Path:
    """The checkpoint at `url`, copied into a cache entry of its own. Its checksums.json names the files to fetch
    (a checkpoint saved before it existed: its metadata does); each name is checked to stay inside the entry
    before anything is fetched or written, and each file against its record while it is copied, before it gets
    its name, so a damaged download is never used and a crafted one writes nowhere else."""
    from cached_path import cached_path

    def fetch(name: str) -> Path:
        try:
            return Path(cached_path(f"{url}/{name}"))
        except Exception as e:
            raise DataError(f"load_path {url}: cannot fetch {name} ({type(e).__name__}: {e})") from e

    def place(name: str) -> None:
        target = safety.confined(dest, name, url)
        expected = records.get(name) if records else None
        if target.exists() and (expected is None or target.stat().st_size == expected["size"]):
            return  # a file is only ever complete under its own name: copied aside, checked, then renamed
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part-{os.getpid()}")
        try:
            integrity.copy_checked(fetch(name), partial, expected, f"{url}/{name}")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def present(name: str) -> bool:
        try:
            fetch(name)
            return True
        except DataError:
            return False

    state = fetch(TRAINER_STATE)
    dest = state.parent / f"checkpoint-{hashlib.sha256(url.encode()).hexdigest()[:16]}"
    dest.mkdir(exist_ok=True)
    records: dict[str, integrity.Record] | None = None
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
