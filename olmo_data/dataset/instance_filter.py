"""The instance filter: OLMo's rule for instances that degenerate into one short token sequence repeated many
times (`data.instance_filter` in OLMo 2's configs), which a trainer keeps in the batch but trains nothing on.

OLMo's rule (`find_periodic_sequences` with `MemMapDataset._validate_instance`) scans each period p from
`repetition_min_period` to `repetition_max_period`, cuts the instance into rows of p tokens, and looks for rows equal
to the row before; a block of such rows, widened by the matching tokens on either side, is a repetition of
`times = length // p` copies (reported only from 3 copies up), and an instance with any repetition of at least
`repetition_max_count` copies is dropped from the loss. Followed to the end, that is a statement about the
positions i where `x[i] == x[i - p]`: a repetition is a maximal run of n such positions (it spans n + p tokens,
`n // p + 1` copies), and the instance is dropped exactly when, for some p, a run is at least
`max(2, repetition_max_count - 1) * p` long. (Such a run always covers a whole row, so the row cut never misses one,
and OLMo's cap of p at a third of the instance follows from the length too.)

That form is what makes the rule cheap: for each period, one comparison of the batch with itself shifted by p, then
"is there a run of k True values" by doubling (a window of 2w is two windows of w), about log2(k) boolean ANDs over the
batch. No Python loop runs over instances or tokens, so a batch of many instances costs a few dozen numpy calls per
period (benchmarks/instance_filter.py; figures in BENCHMARKS.md). Numpy only: the data tools (inspect-batch) and the
trainer apply the same function, so the instances the trainer masks are the ones inspect-batch marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from olmo_data.config import TrainConfig
from olmo_data.errors import DataError

# OLMo 2's settings, and the keys of `data.instance_filter` (the trainer's InstanceFilterConfig has the same)
DEFAULT_MAX_PERIOD, DEFAULT_MIN_PERIOD, DEFAULT_MAX_COUNT = 13, 1, 32
# instances judged together: 32 x 4096 int64 tokens (1 MiB) and their masks stay cache-sized through all periods
ROWS_PER_PASS = 32
CONFIG_KEYS = ("enabled", "repetition_max_period", "repetition_min_period", "repetition_max_count")


@dataclass(frozen=True)
class Repetition:
    """A token sequence repeated back to back, in OLMo's terms: tokens [start, end) are `times` copies of a sequence
    of `period` tokens (the last copy possibly cut short)."""

    start: int
    end: int
    period: int
    times: int


@dataclass(frozen=True)
class RepetitionFilter:
    """OLMo's instance filter with its three settings (OLMo 2: 13, 1, 32)."""

    max_period: int = DEFAULT_MAX_PERIOD
    min_period: int = DEFAULT_MIN_PERIOD
    max_count: int = DEFAULT_MAX_COUNT

    def __post_init__(self) -> None:
        if self.min_period < 1 or self.max_period < 1 or self.max_count < 1:
            raise DataError(f"instance filter: periods and count must be positive, got {self}")
        if self.min_period > self.max_period:
            raise DataError(f"instance filter: min_period {self.min_period} > max_period {self.max_period}")

    @property
    def run_copies(self) -> int:
        """How many period-lengths of matching positions make a repetition count: `times` is one more than the
        run's whole periods, and OLMo reports none of fewer than 3 copies."""
        return max(2, self.max_count - 1)

    def filtered(self, tokens: npt.ArrayLike) -> np.ndarray:
        """For a batch of instances (rows of token ids; one instance is a batch of one), True where OLMo's rule
        drops the instance from the loss (OLMo's `instance_mask` is the negation)."""
        x = np.asarray(tokens)
        if x.ndim == 1:
            return self.filtered(x[None, :])
        if x.ndim != 2:
            raise ValueError(f"expected a batch of instances (2 dimensions), got shape {x.shape}")
        if len(x) > ROWS_PER_PASS:  # a few rows at a time stay in the CPU's cache through all periods
            return np.concatenate([self.filtered(x[i : i + ROWS_PER_PASS]) for i in range(0, len(x), ROWS_PER_PASS)])
        out = np.zeros(len(x), dtype=bool)
        length = x.shape[1]
        for p in range(self.min_period, self.max_period + 1):
            k = self.run_copies * p
            if k > length - p:  # no run is that long; a longer period needs a longer run still
                break
            # a run of k matches holds run_copies matches at multiples of p in a row: a check on every p-th
            # token (1/p of the work) leaves only the rows that may have one for the full check
            every_pth = x[:, ::p]
            maybe = np.flatnonzero(~out & _has_run(every_pth[:, 1:] == every_pth[:, :-1], self.run_copies))
            if len(maybe):
                candidates = x[maybe]
                out[maybe] = _has_run(candidates[:, p:] == candidates[:, :-p], k)
        return out

    def repetitions(self, ids: npt.ArrayLike) -> list[Repetition]:
        """The repetitions of one instance that make the rule drop it (empty: it is kept), by period, then start.
        Slower than `filtered` (it finds where the runs are); meant for reports of a few instances."""
        x = np.asarray(ids)
        if x.ndim != 1:
            raise ValueError(f"expected one instance (1 dimension), got shape {x.shape}")
        out: list[Repetition] = []
        for p in range(self.min_period, self.max_period + 1):
            if self.run_copies * p > len(x) - p:
                break
            same = np.concatenate(([False], x[p:] == x[:-p], [False]))
            edges = np.flatnonzero(same[1:] != same[:-1])  # alternating starts and ends of the runs
            for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                if b - a >= self.run_copies * p:  # positions a+p .. b+p-1 equal the token p before them
                    out.append(Repetition(start=a, end=b + p, period=p, times=(b - a) // p + 1))
        return out

    def settings(self) -> dict[str, Any]:
        """The config section that gives this filter."""
        return {
            "enabled": True,
            "repetition_max_period": self.max_period,
            "repetition_min_period": self.min_period,
            "repetition_max_count": self.max_count,
        }


def _has_run(mask: np.ndarray, k: int) -> np.ndarray:
    """For each row of a boolean matrix, whether it holds k True values in a row (k >= 1)."""
    if mask.shape[1] < k:
        return np.zeros(mask.shape[0], dtype=bool)
    run, width = mask, 1  # run[:, i]: mask[:, i : i + width] all True
    while 2 * width <= k:
        run = run[:, width:] & run[:, :-width]
        width *= 2
    if width < k:  # the rest (< width): two overlapping windows of `width` cover k
        rest = k - width
        run = run[:, rest:] & run[:, :-rest]
    return np.asarray(run.any(axis=1))


def instance_filter_of(config: TrainConfig) -> RepetitionFilter | None:
    """The rule a run's `data.instance_filter` turns on (None when it is off): the trainer masks and
    `inspect-batch` marks by this one function."""
    f = config.data.instance_filter
    if not f.enabled:
        return None
    return RepetitionFilter(f.repetition_max_period, f.repetition_min_period, f.repetition_max_count)
