"""What OLMo-core's datasets share about the files they cache in a work_dir: their folder's fingerprint, and how
`build-order` puts one there.

* `numpy_dataset_fingerprint`: OLMo-core names a dataset's own folder (`dataset-{fingerprint}`) by a sha256 over its
  class, its settings and its files' names and sizes; the interleaved and VSL datasets differ only in which
  settings, so one function spells the hashing for both.
* `keep_or_write`: OLMo-core takes a file it finds in its work_dir as its own without checking it, so one already
  there is kept only when it is byte for byte what OLMo-core would write (anything else is refused: the run would
  read other data), and a new one is written whole or not at all.

This module imports nothing else of `olmo_core`, so the lowest of them (interleaved, which config imports) can use
it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

from olmo_data.errors import DataError
from olmo_data.io import atomic_path


def numpy_dataset_fingerprint(
    class_name: str, settings: Iterable[tuple[str, object]], paths: list[str], size_bytes: list[int]
) -> str:
    """OLMo-core's `fingerprint` of a numpy dataset: `class=NAME`, then `name=value,` for each setting in the order
    given (values as Python prints them), then `path=BASENAME,size=BYTES,` for each file."""
    digest = hashlib.sha256(f"class={class_name}".encode())
    for name, value in settings:
        digest.update(f"{name}={value},".encode())
    for path, size in zip(paths, size_bytes, strict=True):
        digest.update(f"path={os.path.basename(path)},size={size},".encode())
    return digest.hexdigest()


def keep_or_write(path: str, data: bytes, refusal: str) -> bool:
    """Put `data` at `path` for OLMo-core to find: False when an identical file is already there (kept), True when
    written (atomically, its folder made). Anything else at `path` (another size or other bytes, a directory):
    DataError `{path}: {refusal}`, the file left as it is."""
    if os.path.lexists(path):
        same = os.path.isfile(path) and os.path.getsize(path) == len(data)
        if same:
            with open(path, "rb") as f:
                same = f.read() == data
        if not same:
            raise DataError(f"{path}: {refusal}")
        return False
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
    return True
