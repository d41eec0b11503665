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

from olmo_data.dataset.instances import InstanceSource
from olmo_data.dataset.token_files import entry_file_counts
from olmo_data.errors import DataError
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
    the files of entry e follow those of entry e-1, as many as it expands to (an entry listed twice, OLMo's way to
    upsample, is two sources of its own files); files that do not line up with the entries are one source each."""
    entries = [p if is_remote(p) else os.path.abspath(os.path.expanduser(p)) for p in map(str, paths)]
    entries = [e.rstrip("/") for e in entries]
    try:
        counts = entry_file_counts(entries)
    except DataError:  # the entries are not where the files were read from (another working directory)
        counts = []
    out = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    lined_up = len(out) == len(files) and all(
        f == entries[e] or f.startswith(entries[e] + "/") for f, e in zip(files, out.tolist(), strict=True)
    )
    if not lined_up:  # not data.paths' files (a caller without paths): one source per file
        return unique_labels([_short(x) for x in files]), np.arange(len(files), dtype=np.int64)
    return unique_labels([_short(e) for e in entries]), out


def unique_labels(names: list[str]) -> list[str]:
    """The names, each one that another shares given its position as a suffix ("train.0", "train.1"): repeated
    until none collides, so a name that itself ends in ".1" cannot take another's label (metrics by label would
    overwrite each other). Two suffixed labels never collide: the digits after the last "." tell them apart."""
    labels = list(names)
    suffixed = [False] * len(labels)
    while True:
        clashing = [i for i, x in enumerate(labels) if not suffixed[i] and labels.count(x) > 1]
        if not clashing:
            break
        for i in clashing:
            labels[i], suffixed[i] = f"{labels[i]}.{i}", True
    assert len(set(labels)) == len(labels), labels
    return labels


def _short(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name[: -len(".npy")] if name.endswith(".npy") else name
