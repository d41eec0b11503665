"""OLMo-core's instance sources that cut or join: `ConcatAndChunkInstanceSource`, `ConcatenatedInstanceSource`.

An instance source is an array of instances of `sequence_length` tokens. Here each instance is an `Instance`: the
file pieces it is read from, in order (and, for a packed one, the pad id it is filled up with; for a random one,
its tokens), so that a batch's instances are read together and each can name its files.

* `ConcatAndChunk`: each of its token sources on its own, cut into instances of L tokens, keeping only whole runs
  of `max_sequence_length` M (`(tokens // M) * (M // L)` instances a source: what OLMo-core keeps so that the
  order of chunks survives a change of L), numbered source after source.
* `ConcatenatedInstances`: its sources' instances one after the other (nested concatenations flattened).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.tokens import Piece, TokenSource, check_masks


class Instance(NamedTuple):
    """Where one instance's tokens come from (see the module)."""

    pieces: tuple[Piece, ...]
    pad: int | None = None  # packed: its documents padded to L with this id (label mask False there)
    tokens: np.ndarray | None = None  # random: the tokens themselves (no file)


class InstanceSource:
    """What every instance source answers."""

    sequence_length: int
    max_sequence_length: int
    label: str | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def has_mask(self) -> bool:
        """Whether its instances come with a label mask (OLMo-core's batch then has one)."""
        raise NotImplementedError

    def instance(self, index: int) -> Instance:
        raise NotImplementedError

    def files(self) -> list[tuple[str, int]]:
        """(path, tokens) of the token files it reads, in order (a file once per source that reads it)."""
        raise NotImplementedError

    @property
    def num_tokens(self) -> int:
        return len(self) * self.sequence_length

    def check_index(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise DataError(f"instance {index} is out of range: OLMo-core's {type(self).__name__} has {len(self)}")
        return index


def locate(sizes: list[int], index: int) -> tuple[int, int]:
    """(child, index within it) of `index` among children of `sizes` instances end to end."""
    bounds = list(accumulate(sizes, initial=0))
    k = bisect_right(bounds, index) - 1
    while sizes[k] == 0:
        k += 1
    return k, index - bounds[k]


class PartedInstances(InstanceSource):
    """Instances numbered part after part, `counts[k]` of them in part k (a token source cut into instances, a
    child instance source, a sample, a packing group), reading the files of `sources`: what the sources that
    number their instances this way share (their length, mask, files, and which part holds an instance)."""

    sources: Sequence[TokenSource] | Sequence[InstanceSource]
    counts: list[int]

    def __len__(self) -> int:
        return sum(self.counts)

    @property
    def has_mask(self) -> bool:
        return self.sources[0].has_mask  # one for all: checked to agree (check_masks, check_instance_masks)

    def files(self) -> list[tuple[str, int]]:
        return [f for s in self.sources for f in s.files()]

    def part_of(self, index: int) -> tuple[int, int]:
        """(part, index within it) of instance `index`, refused out of range."""
        return locate(self.counts, self.check_index(index))


class ConcatAndChunk(PartedInstances):
    """OLMo-core's `ConcatAndChunkInstanceSource` (see the module)."""

    sources: list[TokenSource]

    def __init__(
        self, sources: list[TokenSource], sequence_length: int, max_sequence_length: int, label: str | None = None
    ) -> None:
        check_masks(sources, "ConcatAndChunkInstanceSource")
        self.sources = sources
        self.sequence_length, self.max_sequence_length = sequence_length, max_sequence_length
        self.label = label
        M = max_sequence_length
        self.counts = [s.num_tokens // M * (M // sequence_length) for s in sources]

    def instance(self, index: int) -> Instance:
        k, local = self.part_of(index)
        start = local * self.sequence_length
        return Instance(tuple(self.sources[k].pieces(start, start + self.sequence_length)))


class ConcatenatedInstances(PartedInstances):
    """OLMo-core's `ConcatenatedInstanceSource` (see the module)."""

    sources: list[InstanceSource]

    def __init__(self, sources: list[InstanceSource], label: str | None = None) -> None:
        flat: list[InstanceSource] = []
        for s in sources:
            flat.extend(s.sources if isinstance(s, ConcatenatedInstances) else [s])
        check_instance_masks(flat, "ConcatenatedInstanceSource")
        self.sources = flat
        self.sequence_length = flat[0].sequence_length
        self.max_sequence_length = flat[0].max_sequence_length
        self.label = label
        self.counts = [len(s) for s in flat]

    def instance(self, index: int) -> Instance:
        k, local = self.part_of(index)
        return self.sources[k].instance(local)


def check_instance_masks(sources: list[InstanceSource], what: str) -> None:
    """Instances with and without label masks in one batch: OLMo-core's collator would stack the masks of only
    some rows (a mask of the wrong shape), so such a run is refused."""
    if len({s.has_mask for s in sources}) > 1:
        raise DataError(
            f"OLMo-core's {what} over instance sources with and without label masks (packing or label_mask_paths "
            "beside sources without): its batches' label masks would not line up with their rows; not covered"
        )
