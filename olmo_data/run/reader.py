"""One reader of a run's data, whichever trainer made it: the interface every command reads a run through.

A run is a config (ours, OLMo's YAML, or the config.json an OLMo-core run saved) and the data it names. What the
commands ask of it is the same for every trainer: the batch of step N (its instances, tokens, label masks,
document lengths), where each instance's tokens come from (file, offset, the documents packed into it, its
source), which instances hold a span of a token file and at which steps they were trained, the run's length, its
data fingerprint, its instance filter, its statistics and its order files. How each trainer answers differs
(OLMo counts epochs from 0 and batches in instances; OLMo-core from 1 and in tokens, with packed and mixed
datasets), so there is one implementation per trainer (`reader_olmo.OlmoRun`, `reader_olmo_core.OlmoCoreRun`),
chosen once from the config's form by `open.read_run`, and no command asks which trainer made a run
(`tests/test_layering.py` checks it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig
from olmo_data.dataset import DocIndex, DocumentSpan, Repetition, TokenFile, rank_slice
from olmo_data.errors import DataError
from olmo_data.run.lineage import Stage
from olmo_data.tokenizer import Tokenizer


@dataclass(frozen=True)
class StepBatch:
    """The global batch of one training step, as the run's trainer cut it (all ranks' rows, position order)."""

    step: int  # 1-based
    global_batch: int  # 0-based batch number over the run
    epoch: int  # as the trainer numbers epochs (OLMo: from 0; OLMo-core: from 1)
    batch_in_epoch: int  # 0-based
    batches_per_epoch: int
    instances: np.ndarray  # the dataset's instance numbers, in batch-position order
    tokens: np.ndarray  # (instances, sequence length)
    label_mask: np.ndarray | None  # True: a training target
    fingerprint: str  # of the global batch, as the trainer logs it
    order_path: str  # the order file read, or "(rebuilt)"
    order_note: str | None = None  # where the order came from, when the trainer's rule says more than a path
    doc_lens: list[np.ndarray] | None = None  # per row, the lengths of the documents packed into it
    global_batch_tokens: int | None = None  # the batch size in tokens, where the trainer counts it so
    sequence_length: int = 0  # tokens a row at this step (variable-length runs); 0: the run's sequence_length
    rank_blocks: bool = False  # rank r of W got the r-th of W consecutive blocks, not positions r, r + W, ...

    @property
    def row_length(self) -> int:
        return self.sequence_length or int(self.tokens.shape[1])

    def rank_positions(self, rank: int, world_size: int) -> np.ndarray:
        """The batch positions rank `rank` of `world_size` trained (the batch splits over them evenly)."""
        n = len(self.instances)
        if world_size < 1 or n % world_size:
            raise DataError(
                f"--world-size {world_size}: world size {world_size} does not divide the global batch size {n} (of "
                f"step {self.step})"
            )
        if not 0 <= rank < world_size:
            raise DataError(f"rank must be in [0, world size), got rank {rank} of world size {world_size}")
        return rank_slice(np.arange(n), rank, world_size, self.rank_blocks)


@dataclass(frozen=True)
class Placed:
    """Where an instance's tokens come from: `length` tokens of `path` from token `start`, or, for an instance
    made of several runs of file tokens (packed documents, interleaved chunks), each piece `(path, start, end)` and
    its position in the instance (`at`; empty: the pieces follow each other from position 0)."""

    index: int
    path: str
    start: int
    length: int
    source: str | None = None
    pieces: tuple[tuple[str, int, int], ...] = ()
    at: tuple[int, ...] = ()
    metadata_path: str | None = None
    num_tokens: int | None = None  # of the token file (the document index's bounds check)

    def positions(self) -> list[int]:
        """Each piece's first position in the instance."""
        if self.at:
            return list(self.at)
        return [0, *np.cumsum([b - a for _, a, b in self.pieces[:-1]]).tolist()] if self.pieces else []


@dataclass(frozen=True)
class Held:
    """Instance `instance` holds `tokens` tokens of a token file from file token `file_start`, at its position
    `at`."""

    instance: int
    file_start: int
    tokens: int
    at: int


@dataclass(frozen=True)
class Trained:
    """An instance was at batch position `position` of step `step` (epoch and batch as the trainer counts)."""

    step: int
    epoch: int
    batch_in_epoch: int
    position: int


@dataclass
class Filtered:
    """What a run's instance filter says of some rows: `masked[i]` True where no target of row i trains;
    `repetitions[i]` the repetitions that caught it, where the rule can say (OLMo's filter), else empty."""

    settings: dict[str, Any]
    masked: np.ndarray
    repetitions: list[list[Repetition]] = field(default_factory=list)


class RunData(ABC):
    """A run's data side (see the module docstring). `config` is what the command was given; `own` is the config
    of a run of this project's trainer (ours or OLMo's form, including one trained on OLMo-core's batches), which
    locates its save folder, per-instance losses and lineage; None for a run another trainer made."""

    config: Any
    own: TrainConfig | None
    sequence_length: int
    seed: int
    num_instances: int
    trainer: str | None = None  # the trainer's name in JSON reports, where it is not this project's
    assumed_dtype: str | None = None  # token files read as this dtype for want of a manifest or data.dtype
    finds_with_index: bool = True  # targets of `trace` may be looked up in a suffix index of the token files

    @abstractmethod
    def data_fingerprint(self) -> str:
        """A digest of what the run's instance numbers mean (files, sizes, the cutting rule, the seed)."""

    @abstractmethod
    def run_steps(self) -> int | None:
        """The steps the run trains (its max_duration); None when the config does not say."""

    @abstractmethod
    def batch(self, step: int) -> StepBatch:
        """The global batch of training step `step` (1-based), tokens read."""

    def batch_note(self, batch: StepBatch) -> str | None:
        """A line saying how this trainer counts, printed under a batch's first line (None: nothing to say)."""
        return None

    def check_world(self, step: int, world_size: int) -> None:
        """Refuse a world size the run's batches at `step` cannot be split over (beyond dividing them evenly):
        nothing more to check for runs whose every rank gets every W-th instance."""
        return None

    def rank_of(self, step: int, position: int, world_size: int) -> int:
        """The rank of `world_size` that trained batch position `position` of step `step`."""
        return position % world_size

    def step_of_batch_index(self, index: int) -> int:
        """The training step of 0-based global batch `index` (the step after `index` steps)."""
        return index + 1

    @abstractmethod
    def batch_size(self, step: int) -> int:
        """Instances in step `step`'s global batch (a batch-size schedule may change it)."""

    @abstractmethod
    def place(self, indices: np.ndarray) -> list[Placed]:
        """Where each instance's tokens come from."""

    @abstractmethod
    def documents(self, placed: Placed, docs: DocIndex) -> list[DocumentSpan] | None:
        """The documents an instance overlaps (None: its token file has no metadata)."""

    def prepare_documents(self, placed: Sequence[Placed], docs: DocIndex) -> None:
        """Fetch what the document lookups of these instances need, for all of them at once (remote files
        concurrently): each file's metadata or index head, then, from range-readable index files, every lookup's
        block of rows and ids in one round."""
        items: list[tuple[str, str | None, int, int]] = []
        for p in placed:
            if p.pieces:
                items += [(path, None, start, end) for path, start, end in p.pieces]
            else:
                items.append((p.path, p.metadata_path, p.start, p.start + p.length))
        docs.prepare(items)

    @abstractmethod
    def instance_filter(self, instances: np.ndarray, tokens: np.ndarray, *, why: bool = False) -> Filtered | None:
        """The run's instance filter on these rows (`why`: with the repetitions that caught each); None: off."""

    @abstractmethod
    def decoder(self, tokenizer: str | None) -> Tokenizer:
        """The tokenizer that decodes the run's tokens (`tokenizer` overrides the data's own)."""

    @abstractmethod
    def token_files(self) -> list[TokenFile]:
        """The run's distinct token files, in the order `trace`'s targets number them (`Target.file_index`)."""

    @abstractmethod
    def target_source(self) -> Any:
        """What `trace`'s target finders read the token files from (an `InstanceSource`, or its `files`)."""

    @abstractmethod
    def holding(self, file_index: int, start: int, end: int) -> list[Held]:
        """Every instance holding a token of tokens [start, end) of token file `file_index`."""

    @abstractmethod
    def trained_at(self, instances: Sequence[int], first: int, last: int) -> dict[int, list[Trained]]:
        """For each instance, every step in [first, last] whose batch held it."""

    @abstractmethod
    def supervised(self, instance: int, start: int, end: int) -> int | None:
        """Target tokens among positions [start, end) of an instance; None where the run has no label masks."""

    @abstractmethod
    def stats(self, *, document_lengths: bool = True, progress: bool | None = None, **overrides: Any) -> Any:
        """`olmo-data stats` of the run's data, as its trainer reads it (the result has `to_json()`).
        `overrides` (sequence_length, global_batch_size, duration, dtype) replace the config's where the trainer's
        config has such keys, and are refused by name where it does not."""

    @abstractmethod
    def format_stats(self, found: Any) -> str:
        """The text `olmo-data stats` prints for `stats()`'s result."""

    @abstractmethod
    def build_orders(
        self, *, epochs: int, first_epoch: int | None, destination: str | None, progress: bool | None = None
    ) -> Iterator[str]:
        """`olmo-data build-order`: write the run's order files; one line per epoch."""

    @abstractmethod
    def stage(self, first: int, last: int) -> Stage:
        """The run as the stage `trace` reports, over steps [first, last]."""

    @abstractmethod
    def lineage(self, last_step: int | None) -> list[Stage]:
        """The stages that shaped the run's weights, itself first (empty where its trainer records none)."""

    @abstractmethod
    def source_labels(self, instances: Sequence[int]) -> list[str]:
        """A source label per instance (its mixture source, data.paths entry or file), for per-source views."""
