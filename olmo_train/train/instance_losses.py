"""The trainer's per-instance and per-source loss records.

Each step's forward also gives every row's cross-entropy sum (`olmo_train.nn.loss.token_loss_rows`); `train_step`
gathers all ranks' rows into global batch order (rank r holds positions r, r+W, ...), and rank 0 appends them to
`save_folder/instance_loss.bin` (format: `olmo_data.run.instance_loss`) and sums them per source of the data
(each data.paths entry or mix source, `olmo_data.dataset.sources`) into `train/source/<label>/loss` and
`.../supervised_tokens`.

The side file follows metrics.jsonl's rule on resume: it is continued when it holds exactly the steps up to the
checkpoint resumed from; otherwise (steps past it, a row cut short by a kill, an earlier run's rows before a fresh
start) it is kept whole as instance_loss.N.bin and the new file begins with the rows up to the checkpoint (with none,
when they end before the checkpoint's step). So it never holds a step twice and has no gap, on any world size.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from olmo_data.io import atomic_path
from olmo_data.run import ROW, instance_loss_aside
from olmo_train.checkpoint import space
from olmo_train.train.metrics import AppendOnlyLog, copy_aside, free_aside

log = logging.getLogger("olmo_train")


def gather_rows(values: torch.Tensor, world_size: int, blocks: bool = False) -> np.ndarray:
    """All ranks' (local batch, k) float64 rows in global batch order: rank r's row i is position r + W*i, or with
    `blocks` (a VSL batch: rank r got the r-th of W consecutive blocks) position r * (local batch) + i."""
    if world_size > 1 and dist.is_initialized():
        parts = [torch.empty_like(values) for _ in range(world_size)]
        dist.all_gather(parts, values.contiguous())
        if blocks:
            return torch.cat(parts, dim=0).cpu().numpy()
        stacked = torch.stack(parts, dim=1)  # (local batch, W, k): position i*W + r
        values = stacked.reshape(-1, values.shape[-1])
    return values.cpu().numpy()


def source_metrics(
    labels: list[str], source_ids: np.ndarray, loss_sum: np.ndarray, tokens: np.ndarray
) -> dict[str, Any]:
    """train/source/<label>/supervised_tokens for every source and .../loss (mean per supervised token) where the
    step had any; their token-weighted mean is the step's train/loss."""
    out: dict[str, Any] = {}
    token_sums = np.bincount(source_ids, weights=tokens, minlength=len(labels))
    loss_sums = np.bincount(source_ids, weights=loss_sum, minlength=len(labels))
    for i, label in enumerate(labels):
        out[f"train/source/{label}/supervised_tokens"] = int(token_sums[i])
        if token_sums[i] > 0:
            out[f"train/source/{label}/loss"] = float(loss_sums[i] / token_sums[i])
    return out


class InstanceLossLog(AppendOnlyLog):
    def start(self, resume_step: int) -> None:
        """Append after the rows of steps up to `resume_step`; a file holding anything else is set aside first."""
        if not self.enabled:
            return
        with space.refused_writes(self.path.parent, self.path.name):
            self._start(resume_step)

    def _start(self, resume_step: int) -> None:
        size = self.path.stat().st_size if self.path.is_file() else 0
        keep, last, why = 0, 0, ""
        if size >= ROW.itemsize:
            rows = np.memmap(self.path, dtype=ROW, mode="r", shape=(size // ROW.itemsize,))
            kept = int(np.searchsorted(rows["step"], resume_step, "right"))
            keep, last = kept * ROW.itemsize, int(rows["step"][kept - 1]) if kept else 0
            del rows
        if keep != size:
            why = f"holds rows past step {resume_step}, where this run resumes, or a row cut short"
        if keep and last != resume_step:  # steps last+1..resume_step are missing: continuing would leave a gap
            keep, why = 0, f"ends at step {last}, before step {resume_step}, where this run resumes"
        if keep != size:
            aside = free_aside(self.path, instance_loss_aside)
            copy_aside(self.path, aside)
            with atomic_path(self.path) as tmp, aside.open("rb") as src, tmp.open("wb") as dst:
                _copy_prefix(src, dst, keep)
            log.warning(
                "%s %s: kept whole as %s; %s continues after step %d",
                self.path,
                why,
                aside.name,
                self.path.name,
                resume_step,
            )
        self._file = self.path.open("ab")

    def write(self, step: int, loss_sum: np.ndarray, tokens: np.ndarray) -> None:
        """Append step `step`'s rows (global batch order) in one write."""
        if not self.enabled:
            return
        rows = np.empty(len(loss_sum), dtype=ROW)
        rows["step"] = step
        rows["position"] = np.arange(len(loss_sum))
        rows["tokens"] = tokens
        rows["loss_sum"] = loss_sum
        self.append(rows.tobytes(), step)


def _copy_prefix(src: Any, dst: Any, length: int) -> None:
    left = length
    while left > 0:
        chunk = src.read(min(left, 1 << 24))
        if not chunk:
            break
        dst.write(chunk)
        left -= len(chunk)
