"""The per-instance loss record of a run: which instances of a step the model found hard.

The trainer appends, after every step, one fixed-width row per instance of the global batch to
`save_folder/instance_loss.bin` (headerless, little-endian, rows of `ROW`):

    step      uint32   the training step (1-based; step N trains batch N-1)
    position  uint32   the instance's position in the global batch (what `inspect-batch` numbers [p])
    tokens    uint32   its supervised target tokens (0 for an instance the instance filter masked)
    loss_sum  float64  the sum of their cross-entropy (nats), from the step's own forward

Rows are in (step, position) order whatever the world size, so the file of a run is the same on 1 or 64 ranks and
a reader finds a step by binary search, without reading the rest. 20 bytes per instance: a run of 100K steps of
1024 instances takes 2 GB, a hundredth of a 7B model's checkpoint. A resumed run keeps the rows up to its checkpoint
and sets the rest aside (as metrics.jsonl), so the file never holds a step twice.

This module reads it with numpy alone (`olmo-data inspect-batch`, `olmo-data spikes`); the trainer's writer is
`olmo_train.train.instance_losses`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from olmo_data.errors import DataError
from olmo_data.run.layout import METRICS

ROW = np.dtype([("step", "<u4"), ("position", "<u4"), ("tokens", "<u4"), ("loss_sum", "<f8")])


@dataclass
class StepLosses:
    """One step's instances, by position in the global batch."""

    step: int
    tokens: np.ndarray  # int64 (global batch size,)
    loss_sum: np.ndarray  # float64 (global batch size,)

    @property
    def loss(self) -> np.ndarray:
        """Mean cross-entropy per supervised token of each instance (NaN where it has none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.tokens > 0, self.loss_sum / np.maximum(self.tokens, 1), np.nan)


def read_rows(path: str | os.PathLike[str]) -> np.ndarray:
    """Every complete row of the file (a row cut short by a kill is left out), memory-mapped."""
    size = os.path.getsize(path)
    n = size // ROW.itemsize
    if n == 0:
        return np.zeros(0, dtype=ROW)
    return np.memmap(path, dtype=ROW, mode="r", shape=(n,))


def step_losses(path: str | os.PathLike[str], step: int) -> StepLosses | None:
    """Step `step`'s rows, or None when the file has none for it (the run did not train it, or an older run
    without the record)."""
    if not os.path.isfile(path):
        return None
    rows = read_rows(path)
    steps = rows["step"]
    lo, hi = int(np.searchsorted(steps, step, "left")), int(np.searchsorted(steps, step, "right"))
    if lo == hi:
        return None
    chunk = np.asarray(rows[lo:hi])
    positions = chunk["position"].astype(np.int64)
    if not np.array_equal(positions, np.arange(len(chunk))):
        raise DataError(
            f"{path}: step {step}'s rows are not positions 0..{len(chunk) - 1} in order; the file is not one "
            "written by the trainer"
        )
    return StepLosses(step, chunk["tokens"].astype(np.int64), chunk["loss_sum"].astype(np.float64))


def logged_batch_fingerprint(folder: str | os.PathLike[str], step: int) -> str | None:
    """The batch fingerprint the run in `folder` logged for `step` (metrics.jsonl), or None if it logged none.

    The losses of a save folder belong to the batches that run trained; a config that names the folder but other
    data, seed or order would pair them with other instances, silently. `inspect-batch` compares this with the
    fingerprint of the batch it rebuilt before it shows a loss."""
    path = os.path.join(folder, METRICS)
    if not os.path.isfile(path):
        return None
    keys = (f'"step": {step},', f'"step": {step}}}')
    found = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not any(k in line for k in keys):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and record.get("step") == step and "train/batch_fingerprint" in record:
                found = str(record["train/batch_fingerprint"])  # the last one: a resumed run's
    return found
