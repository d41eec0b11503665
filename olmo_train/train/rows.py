"""What the loop's data layer reads from a run, whichever trainer's rules cut its batches: one rank's rows of a
step (`Rows`) from a `StepReader`. The implementations are `own_data.OwnReader` (this project's and OLMo's rules:
`data.paths` / `data.mix`) and `olmo_core_data.CoreReader` (`data.olmo_core`: OLMo-core's batches), chosen once
by `readers.open_step_reader`; `data.TrainData` (read-ahead, step order) knows neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Rows:
    """One rank's rows of a step's global batch."""

    epoch: int  # 0-based, as this trainer counts epochs
    tokens: np.ndarray
    label_mask: np.ndarray | None
    instance_mask: np.ndarray | None  # True: trained (the instance filter's verdict); None: no filter
    fingerprint: str | None  # of the global batch, rank 0 only
    sources: np.ndarray | None  # rank 0: each batch position's source number (into the reader's sources.labels)
    doc_starts: np.ndarray | None = None  # (rows, L) bool, True where a document starts (model.document_masking)
    rank_blocks: bool = False  # rank r of W holds the r-th of W consecutive blocks of the batch, not every W-th row


class SourceLabels(Protocol):
    """Source labels for train/source/<label>/... metrics, and each instance's source number among them."""

    @property
    def labels(self) -> list[str]: ...

    def of(self, indices: np.ndarray) -> np.ndarray: ...


class StepReader(Protocol):
    """A run's batches as the loop reads them: safe from the read-ahead threads."""

    num_instances: int
    fingerprint: str  # the data fingerprint a resume is checked against
    remote: bool  # some of its files are remote (the loop then logs retried reads)

    @property
    def sources(self) -> SourceLabels: ...

    def epoch_of(self, step: int) -> int:
        """The 0-based epoch of step `step`."""
        ...

    def ensure_epoch(self, epoch: int) -> None:
        """Whatever must exist before any rank reads the epoch (its order file); collective."""
        ...

    def read(self, step: int) -> Rows:
        """This rank's rows of step `step`'s global batch."""
        ...
