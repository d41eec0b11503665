"""The run reader for OLMo-core's trainer (`reader.RunData`): the config.json an OLMo-core run saved, or a config
of ours whose `data.olmo_core` names one (a run of this project's trainer on OLMo-core's batches).

Everything is `olmo_data.olmo_core`'s rebuilding of OLMo-core 3.0.0's loader: epochs count from 1, batches are
sized in tokens (a batch-size schedule may change them), datasets may be padded, mixed or packed (a packed
instance holds pieces of several documents and its `doc_lens`), and the instance filter is OLMo-core's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig
from olmo_data.dataset import DocIndex, DocumentSpan, TokenFile, format_stats, run_steps
from olmo_data.errors import DataError
from olmo_data.io import file_size
from olmo_data.olmo_core import (
    OlmoCoreData,
    build_olmo_core_orders,
    data_fingerprint,
    format_olmo_core_stats,
    instances_holding,
    olmo_core_stats,
    run_length,
    trained_at,
)
from olmo_data.run.lineage import Stage
from olmo_data.run.reader import Filtered, Held, Placed, RunData, StepBatch, Trained
from olmo_data.tokenizer import Tokenizer, load_tokenizer


@dataclass
class CoreFiles:
    """OLMo-core's distinct token files in the shape `trace`'s target finders read (`files`)."""

    files: list[TokenFile]


class OlmoCoreRun(RunData):
    """An OLMo-core run's data (`core`); `own` is our config when our trainer trained on its batches."""

    trainer = "olmo-core"
    finds_with_index = False

    def __init__(self, config: Any, core: OlmoCoreData, own: TrainConfig | None = None) -> None:
        self.config, self.core, self.own = config, core, own
        self.sequence_length = core.run.sequence_length
        self.seed = core.run.seed
        self.num_instances = len(core.dataset)
        self._paths = list(dict.fromkeys(core.dataset.paths))
        self._files: list[TokenFile] | None = None

    def data_fingerprint(self) -> str:
        return data_fingerprint(self.core)

    def run_steps(self) -> int | None:
        if self.own is not None:  # a run of ours: its own max_duration, in its steps
            return run_steps(self.own, self.num_instances)
        return run_length(self.core)

    def batch_size(self, step: int) -> int:
        return self.core.slot(step).instances

    def batch(self, step: int) -> StepBatch:
        batch = self.core.batch(step)
        assert batch.tokens is not None
        order = self.core.epoch_order(batch.epoch)
        return StepBatch(
            step=step,
            global_batch=step - 1,
            epoch=batch.epoch,
            batch_in_epoch=batch.batch_in_epoch,
            batches_per_epoch=self.core.walk.batches_per_epoch(batch.global_batch_tokens),
            instances=batch.instances,
            tokens=batch.tokens,
            label_mask=batch.label_mask,
            fingerprint=batch.fingerprint or "",
            order_path=order.path or "(rebuilt)",
            order_note=batch.order_note,
            doc_lens=batch.doc_lens,
            global_batch_tokens=batch.global_batch_tokens,
            sequence_length=batch.sequence_length,
            rank_blocks=batch.rank_blocks,
        )

    def check_world(self, step: int, world_size: int) -> None:
        self.core.batch(step, 0, world_size, read=False)  # OLMo-core's own rules for splitting the step's batch

    def rank_of(self, step: int, position: int, world_size: int) -> int:
        return self.core.walk.rank_of(position, self.core.slot(step).instances, world_size)

    def batch_note(self, batch: StepBatch) -> str:
        return (
            f"an OLMo-core run: epochs counted from 1 as OLMo-core counts them; global batch "
            f"{batch.global_batch_tokens or 0:,} tokens ({len(batch.instances)} instances)"
        )

    def place(self, indices: np.ndarray) -> list[Placed]:
        return [
            Placed(loc.index, loc.path, loc.start, loc.length, source=loc.source, pieces=loc.pieces, at=loc.at)
            for loc in self.core.locate(indices)
        ]

    def documents(self, placed: Placed, docs: DocIndex) -> list[DocumentSpan] | None:
        if not placed.pieces:
            return docs.lookup(placed.path, placed.start, placed.start + placed.length)
        out: list[DocumentSpan] = []  # each piece's documents, placed where the piece sits in the instance
        for (path, start, end), at in zip(placed.pieces, placed.positions(), strict=True):
            spans = docs.lookup(path, start, end)
            if spans is None:
                return None
            out += [replace(d, instance_start=d.instance_start + at, instance_end=d.instance_end + at) for d in spans]
        return out

    def instance_filter(self, instances: np.ndarray, tokens: np.ndarray, *, why: bool = False) -> Filtered | None:
        keep = self.core.instance_mask(instances, tokens)
        if keep is None or self.core.run.instance_filter is None:
            return None
        masked = ~keep
        return Filtered(self.core.run.instance_filter.settings(), masked, [[] for _ in masked])

    def decoder(self, tokenizer: str | None) -> Tokenizer:
        if tokenizer is None:
            raise DataError("--decode of an OLMo-core run needs --tokenizer PATH (its config names no tokenizer file)")
        return load_tokenizer(tokenizer, "auto" if tokenizer.endswith(".tiktoken") else "hf")

    def token_files(self) -> list[TokenFile]:
        if self._files is None:
            itemsize = self.core.dataset.itemsize
            self._files = [TokenFile(p, self.core.run.dtype, file_size(p) // itemsize) for p in self._paths]
        return self._files

    def target_source(self) -> Any:
        if self.core.run.dtype not in ("uint16", "uint32"):
            raise DataError(
                f"--text/--tokens: token files of dtype {self.core.run.dtype} are not searched; trace documents"
            )
        return CoreFiles(self.token_files())

    def holding(self, file_index: int, start: int, end: int) -> list[Held]:
        return [Held(*h) for h in instances_holding(self.core, self._paths[file_index], start, end)]

    def trained_at(self, instances: Sequence[int], first: int, last: int) -> dict[int, list[Trained]]:
        found = trained_at(self.core, list(instances), first, last, 1)
        slot = self.core.slot
        return {
            k: [Trained(at.step, at.epoch, slot(at.step).batch, at.position) for at in ats] for k, ats in found.items()
        }

    def supervised(self, instance: int, start: int, end: int) -> int | None:
        if self.core.run.label_mask_paths is None:
            return None
        _, masks = self.core.dataset.get_batch(np.array([instance]))
        return int(masks[0][start:end].sum()) if masks is not None else None

    def stats(self, *, document_lengths: bool = True, progress: bool | None = None, **overrides: Any) -> Any:
        given = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None]
        if given:
            raise DataError(
                f"{' '.join(given)}: an OLMo-core run's data (its config.json) gives the data, batch size and "
                "duration; no options"
            )
        return olmo_core_stats(self.core)

    def format_stats(self, found: Any) -> str:
        return format_olmo_core_stats(found, format_stats(found.stats))

    def build_orders(
        self, *, epochs: int, first_epoch: int | None, destination: str | None, progress: bool | None = None
    ) -> Iterator[str]:
        first = 1 if first_epoch is None else first_epoch
        yield from build_olmo_core_orders(self.core, epochs=epochs, first_epoch=first, destination=destination)

    def source_labels(self, instances: Sequence[int]) -> list[str]:
        return [p.source or p.path for p in self.place(np.asarray(list(instances), dtype=np.int64))]

    def stage(self, first: int, last: int) -> Stage:
        """The OLMo-core run as the one stage of its trace (OLMo-core records no lineage to follow)."""
        raw = self.core.raw
        return Stage(
            index=0,
            parent_of=None,
            depth=0,
            source="run",
            run_name=str(raw.get("run_name") or raw.get("trainer", {}).get("save_folder") or "olmo-core"),
            config=self.config if isinstance(self.config, str) else None,
            checkpoint=None,
            given=None,
            first_step=first,
            last_step=last,
            checkpoint_step=None,
            tokens_seen=None,
            batch_tokens=self.core.batch(first, read=False).global_batch_tokens,
            data_fingerprint=self.data_fingerprint(),
        )

    def lineage(self, last_step: int | None) -> list[Stage]:
        return []
