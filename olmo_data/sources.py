"""The sources of a training run's data, by label: each mix source (its name), or without a mix each data.paths
entry (a token file or a tokenized directory, labelled by its base name).

Per-source metrics (`train/source/<label>/...`) and `olmo-data spikes` name an instance's source with these labels;
the mapping goes instance -> token file -> source, so it costs one binary search per instance.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from olmo_data.instances import InstanceSource
from olmo_data.io import is_remote


class Sources:
    """Source labels of an `InstanceSource` and the source of any of its instances."""

    def __init__(self, source: InstanceSource, paths: Sequence[str] | None = None) -> None:
        self.source = source
        if source.mix is not None:
            self.labels = source.source_names
            by_name = {name: i for i, name in enumerate(self.labels)}
            self.file_source = np.array([by_name[source.source_of_file(k) or ""] for k in range(len(source.files))])
        else:
            self.labels, self.file_source = _path_entries([f.path for f in source.files], list(paths or []))

    def of(self, indices: npt.ArrayLike) -> np.ndarray:
        """The source number (an index into `labels`) of each dataset instance."""
        base = self.source.base_indices(indices)
        files = np.searchsorted(self.source.file_offsets, base, side="right") - 1
        return np.asarray(self.file_source[files], dtype=np.int64)


def _path_entries(files: list[str], paths: list[str]) -> tuple[list[str], np.ndarray]:
    """Each data.paths entry's label, and the entry of each token file. Entries expand to their files in order, so
    the files of entry e follow those of entry e-1; a file no entry names is its own source."""
    entries = [p if is_remote(p) else os.path.abspath(os.path.expanduser(p)) for p in map(str, paths)]
    entries = [e.rstrip("/") for e in entries]
    labels: list[str] = []
    names = [_short(e) for e in entries]
    for i, name in enumerate(names):
        labels.append(name if names.count(name) == 1 else f"{name}.{i}")
    out = np.zeros(len(files), dtype=np.int64)
    e = 0
    for k, f in enumerate(files):
        while e < len(entries) and not (f == entries[e] or f.startswith(entries[e] + "/")):
            e += 1
        if e == len(entries):  # not data.paths' files (a caller without paths): one source per file
            labels = [_short(x) for x in files]
            return labels, np.arange(len(files), dtype=np.int64)
        out[k] = e
    return labels, out


def _short(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name[: -len(".npy")] if name.endswith(".npy") else name
