"""Placing examples into instances, and the files of a prepared chat directory.

Destination layout:
  input_ids.npy       headerless little-endian uint16/uint32: instances of `seq_len` tokens back to back
  label_mask.npy      headerless bool (one byte per token) aligned with input_ids.npy; True = trained
  input_ids.csv.gz    headerless `start,end,id,src,loc` per example (as `tokenize` writes), file order
  metadata.jsonl      one JSON object per example, file order: id, dataset, src, row, tokens,
                      trained_tokens, full_tokens, truncated, instance, start, end
  doc_boundaries.npy  headerless little-endian uint64 (start, end) pairs per example, file order
  manifest.json       format "olmo-data.chat"; written last, so its presence means the directory is complete

Without `pack` each example is one instance, right-padded with the pad id (mask False), as OLMo does. With
`pack`, examples are placed in input order into the first of the last `pack_window` open instances with room
(first fit); a new instance is opened when none has room; instances are written in the order they were opened.
An example is never split (one longer than `seq_len` was already truncated to it); instance tails are padded.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from olmo_data.dataset import DTYPES
from olmo_data.errors import DataError
from olmo_data.io import gzip_text_writer

INPUT_IDS = "input_ids.npy"
LABEL_MASK = "label_mask.npy"
DOC_METADATA = "input_ids.csv.gz"
EXAMPLES = "metadata.jsonl"
BOUNDARIES = "doc_boundaries.npy"
OUTPUT_FILES = (INPUT_IDS, LABEL_MASK, DOC_METADATA, EXAMPLES, BOUNDARIES)


@dataclass
class _Instance:
    index: int
    fill: int = 0
    ids: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)


class InstanceWriter:
    """Places examples into instances (one each, or packed first fit) and streams full instances out."""

    def __init__(self, tmp: dict[str, Path], seq_len: int, pack: bool, pack_window: int, dtype: str, pad: int) -> None:
        self.L, self.dtype, self.pad = seq_len, np.dtype(DTYPES[dtype]).newbyteorder("<"), pad
        self.pack, self.window = pack, pack_window
        self.ids_f: IO[bytes] = open(tmp[INPUT_IDS], "wb")  # noqa: SIM115 - closed in close()
        self.mask_f: IO[bytes] = open(tmp[LABEL_MASK], "wb")  # noqa: SIM115
        self.bounds_f: IO[bytes] = open(tmp[BOUNDARIES], "wb")  # noqa: SIM115
        self.examples_f: IO[str] = open(tmp[EXAMPLES], "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self.csv_f: io.TextIOWrapper = gzip_text_writer(tmp[DOC_METADATA])
        self.csv = csv.writer(self.csv_f, lineterminator="\n")
        self.open: deque[_Instance] = deque()
        self.instances = 0
        self.examples = 0
        self.trained = 0
        self.padding = 0

    def add(self, ids: np.ndarray, mask: np.ndarray, record: dict[str, Any]) -> None:
        n = len(ids)
        target = None
        if self.pack:
            target = next((inst for inst in self.open if self.L - inst.fill >= n), None)
        if target is None:
            target = _Instance(self.instances)
            self.instances += 1
            self.open.append(target)
        start = target.index * self.L + target.fill
        record.update(instance=target.index, start=start, end=start + n)
        target.ids.append(ids)
        target.masks.append(mask)
        target.records.append(record)
        target.fill += n
        while self.open and (not self.pack or len(self.open) > self.window or self.open[0].fill == self.L):
            self._write(self.open.popleft())

    def _write(self, inst: _Instance) -> None:
        pad = self.L - inst.fill
        ids = np.concatenate([*inst.ids, np.full(pad, self.pad, dtype=np.uint32)]).astype(self.dtype)
        mask = np.concatenate([*inst.masks, np.zeros(pad, dtype=np.bool_)])
        self.ids_f.write(ids.tobytes())
        self.mask_f.write(mask.tobytes())
        self.padding += pad
        self.trained += int(mask.sum())
        for r in inst.records:
            self.csv.writerow((r["start"], r["end"], r["id"], r["src"], r["row"]))
            self.examples_f.write(json.dumps(r, ensure_ascii=False) + "\n")
            self.bounds_f.write(np.array([r["start"], r["end"]], dtype="<u8").tobytes())
        self.examples += len(inst.records)

    def close(self) -> None:
        while self.open:
            self._write(self.open.popleft())
        for f in (self.ids_f, self.mask_f, self.bounds_f, self.examples_f, self.csv_f):
            f.close()

    def abort(self) -> None:
        for f in (self.ids_f, self.mask_f, self.bounds_f, self.examples_f, self.csv_f):
            with contextlib.suppress(Exception):
                f.close()


def read_doc_boundaries(directory: str) -> np.ndarray:
    """The (start, end) token offsets of each example of a chat directory: shape (examples, 2), file order."""
    path = os.path.join(directory, BOUNDARIES)
    if not os.path.exists(path):
        raise DataError(f"{path}: not found; is {directory} a directory written by `olmo-data prepare-tulu`?")
    return np.memmap(path, dtype="<u8", mode="r").reshape(-1, 2)
