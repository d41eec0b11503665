"""A composable run opened for `OlmoCoreData`: its instances as `CoreInstance`s, its batches' rows, its orders.

`open_composable(run)` builds the dataset list's sources (`build`), the loader (`loader`) and the step walk.
`ComposableDataset` numbers the instances of all the sources end to end (see `loader` for how that relates to
OLMo-core's per-epoch index) and reads a batch as OLMo-core's `ComposableDataLoader.get_instance` and collator
give it: int64 ids, the label mask when the instances have one (a packed instance's is False on its padding),
and the `doc_lens` of each row (`get_document_lengths` with the loader tokenizer's EOS and BOS ids).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from olmo_data.dataset import LABEL_MASK_DTYPE, read_arrays
from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.build import Context, build_instances
from olmo_data.olmo_core.composable.holding import PieceTable
from olmo_data.olmo_core.composable.instances import Instance, check_instance_masks
from olmo_data.olmo_core.composable.loader import ComposableOrder, Loader
from olmo_data.olmo_core.composable.spec import ComposableSpec
from olmo_data.olmo_core.config import NUMPY_DTYPES, OlmoCoreRun
from olmo_data.olmo_core.dataset import CoreInstance, OlmoCoreDataset
from olmo_data.olmo_core.packed import doc_lengths
from olmo_data.olmo_core.steps import StepWalk


class ComposableDataset(OlmoCoreDataset):
    """The instances of a composable run (all its sources end to end), located and read as OLMo-core reads them."""

    def __init__(self, run: OlmoCoreRun, loader: Loader) -> None:
        files = dict.fromkeys(f for s in loader.sources for f in s.files())  # each file once, in order
        super().__init__(run, [p for p, _ in files], [t for _, t in files])
        self.loader = loader
        self.file_of = {p: i for i, p in enumerate(self.paths)}
        self._table: PieceTable | None = None

    @property
    def table(self) -> PieceTable:
        """Every instance's pieces (built on first use: one pass over the instances; see `holding`)."""
        if self._table is None:
            self._table = PieceTable(self.loader.sources, self.paths)
        return self._table

    @property
    def offsets(self) -> np.ndarray:  # type: ignore[override]
        """Per file, the instances whose first piece is in it, as cumulative counts (what `stats` shows)."""
        first = self.table.first_files()
        counts = np.bincount(first[first >= 0], minlength=len(self.paths))
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @offsets.setter
    def offsets(self, value: np.ndarray) -> None:
        pass  # OlmoCoreDataset's count of chunks per file is not a composable run's

    def __len__(self) -> int:
        return len(self.loader)

    def instance(self, index: int) -> tuple[str | None, Instance]:
        """The label of the loader source an instance is in (OLMo-core's batch metadata `source`), and it."""
        k, local = self.loader.locate(index)
        source = self.loader.sources[k]
        return source.label, source.instance(local)

    def locate(self, indices: npt.ArrayLike) -> list[CoreInstance]:
        out = []
        for i in np.asarray(indices, dtype=np.int64).reshape(-1).tolist():
            label, inst = self.instance(i)
            if inst.tokens is not None:  # a random instance: no file
                out.append(CoreInstance(i, -1, "", 0, self.run.sequence_length, label))
                continue
            first = inst.pieces[0]
            length = sum(p.end - p.start for p in inst.pieces)
            pieces = tuple((p.path, p.start, p.end) for p in inst.pieces) if len(inst.pieces) > 1 else ()
            out.append(CoreInstance(i, self.file_of[first.path], first.path, first.start, length, label, pieces))
        return out

    def get_batch(self, indices: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray | None]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        insts = [self.instance(i)[1] for i in idx]
        flat = [p for inst in insts for p in inst.pieces]
        reads: list[tuple[str, Any, int, int]] = [
            (p.path, NUMPY_DTYPES[p.dtype], p.start, p.end - p.start) for p in flat
        ]
        reads += [(p.mask, LABEL_MASK_DTYPE, p.start, p.end - p.start) for p in flat if p.mask is not None]
        arrays = read_arrays(reads)
        masks = iter(arrays[len(flat) :])
        L = self.run.sequence_length
        tokens = np.full((len(idx), L), self.run.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(idx), L), dtype=bool) if self.loader.has_mask else None
        at = 0
        for row, inst in enumerate(insts):
            if inst.tokens is not None:
                tokens[row] = inst.tokens
                continue
            col = 0
            for p in inst.pieces:
                part = arrays[at]
                at += 1
                tokens[row, col : col + len(part)] = part
                if mask is not None:
                    mask[row, col : col + len(part)] = next(masks) if p.mask is not None else True
                col += len(part)
            if inst.pad is not None:
                tokens[row, col:] = inst.pad
            elif col != L:
                raise DataError(f"instance {idx[row]} holds {col} tokens, not {L}")
        self.check_vocab(tokens, idx, insts)
        return tokens, mask

    def check_vocab(self, tokens: np.ndarray, idx: list[int], insts: list[Instance]) -> None:
        """Every id below the vocabulary size, else one line naming the instance's first file."""
        over = np.flatnonzero((tokens >= self.run.vocab_size).any(axis=1))
        if len(over):
            row = int(over[0])
            pieces = insts[row].pieces
            where = pieces[0].path if pieces else "a random instance"
            raise DataError(
                f"{where}: instance {idx[row]} reads an id past data_loader.tokenizer.vocab_size "
                f"{self.run.vocab_size:,} of {self.run.source} (read as {pieces[0].dtype if pieces else '-'}): the "
                "file holds another dtype, or the config names another tokenizer"
            )


class Composable:
    """A composable run's dataset, loader and step walk, for `OlmoCoreData`."""

    def __init__(self, run: OlmoCoreRun, spec: ComposableSpec) -> None:
        ctx = Context(run, spec.source)
        sources = [build_instances(node, ctx) for node in spec.sources]
        try:
            check_instance_masks(sources, "ComposableDataLoader")
        except DataError as e:
            raise DataError(f"{spec.source}: the dataset list: {e}") from e
        self.loader = Loader(spec, sources, run)
        self.dataset = ComposableDataset(run, self.loader)
        self.walk: StepWalk = self.loader.walk()
        self.run = run

    def order(self, epoch: int) -> ComposableOrder:
        return self.loader.order(epoch)

    def holding(self, path: str, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """`olmo_data.olmo_core.runs.instances_holding` of a composable run (see `holding`)."""
        k = self.dataset.file_of.get(path)
        return [] if k is None else self.dataset.table.holding(k, start, end)

    def held_per_file(self) -> list[int]:
        return self.dataset.table.held_per_file()

    def steps_in(self, epochs: int) -> int:
        """The steps of a run of `epochs` epochs (trainer.max_duration in epochs), each epoch its own size."""
        return self.loader.steps_in(epochs)

    def write_orders(self, epochs: range, folder: str) -> list[str]:
        """`build-order` of a composable run: its loader's order files (the sources' caches OLMo-core rebuilds)."""
        return self.loader.write_orders(epochs, folder)

    def describe(self) -> dict[str, Any]:
        """What decides its instances and order, for the run's data fingerprint."""
        return self.loader.spec.describe()

    def doc_lens(self, tokens: np.ndarray) -> list[np.ndarray]:
        """OLMo-core's `doc_lens` of each row (the loader's `generate_doc_lengths`)."""
        return [doc_lengths(row, self.run.eos_token_id, self.run.bos_token_id) for row in tokens]


def open_composable(run: OlmoCoreRun) -> Composable:
    """The composable run `run` describes (its `composable` spec, read by `olmo_data.olmo_core.config`)."""
    if not isinstance(run.composable, ComposableSpec):
        raise DataError(f"{run.source}: not a run on OLMo-core's composable data API")
    return Composable(run, run.composable)
