"""OLMo-core's slices: `SlicedTokenSource`, `SlicedInstanceSource`, and the split configs that make them.

* `SlicedTokens`: tokens [start, stop) of another token source (OLMo-core's `SplitTokenSourceConfig` cuts its
  source, its sources concatenated, at `int(ratio * tokens)`; `SamplingTokenSource` takes a slice of a source).
  A token source only: it has no documents.
* `SlicedInstances`: the instances at positions [start, stop) of OLMo-core's `build_global_indices` over the
  source (its chunks of M // L instances shuffled with PCG64(seed), in order without a seed), cut to whole
  chunks. `SplitInstanceSourceConfig` cuts at `int(ratio * instances)`; both halves shuffle with the same seed,
  so together they hold every instance once. The slice keeps its source's label.
"""

from __future__ import annotations

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import Instance, InstanceSource
from olmo_data.olmo_core.composable.loader import global_indices
from olmo_data.olmo_core.composable.tokens import Concatenated, Piece, TokenSource


class SlicedTokens(TokenSource):
    """OLMo-core's `SlicedTokenSource` over tokens [start, stop) of `source` (stop None: to its end)."""

    def __init__(self, source: TokenSource, start: int, stop: int | None, label: str | None = None) -> None:
        n = source.num_tokens
        self.source = source
        self.start = int(start)
        self.stop = n if stop is None else int(stop)
        self.label = label
        if self.size == 0:
            raise DataError(
                f"OLMo-core's SlicedTokenSource of tokens {self.start}..{self.stop} of a source of {n:,} tokens is "
                "empty (OLMo-core refuses it)"
            )

    @property
    def size(self) -> int:
        n = self.source.num_tokens
        return 0 if self.start >= n else max(0, min(self.stop, n) - self.start)

    @property
    def num_tokens(self) -> int:
        return self.size

    @property
    def has_mask(self) -> bool:
        return self.source.has_mask

    def files(self) -> list[tuple[str, int]]:
        return self.source.files()

    def pieces(self, start: int, end: int) -> list[Piece]:
        if not 0 <= start < end <= self.size:
            raise DataError(f"tokens {start}..{end} are outside a slice of {self.size:,} tokens")
        return self.source.pieces(start + self.start, end + self.start)


def split_tokens(sources: list[TokenSource], ratio: float, idx: int) -> SlicedTokens:
    """`SplitTokenSourceConfig.build`: the first (idx 0) or second part of its source at `int(ratio * tokens)`."""
    source = sources[0] if len(sources) == 1 else Concatenated(sources, document=False)
    cut = int(ratio * source.num_tokens)
    return SlicedTokens(source, 0, cut) if idx == 0 else SlicedTokens(source, cut, None)


class SlicedInstances(InstanceSource):
    """OLMo-core's `SlicedInstanceSource` (see the module)."""

    def __init__(self, source: InstanceSource, start: int | None, stop: int | None, seed: int | None) -> None:
        self.source = source
        self.sequence_length, self.max_sequence_length = source.sequence_length, source.max_sequence_length
        self.label = source.label
        order = global_indices(len(source), self.sequence_length, self.max_sequence_length, seed)
        self.indices = order[slice(start, stop)]
        if self.indices.size == 0:
            raise DataError(
                f"OLMo-core's SlicedInstanceSource of positions {start}..{stop} of a source of {len(source):,} "
                "instances is empty (OLMo-core refuses it)"
            )
        chunk = self.max_sequence_length // self.sequence_length
        self.count = chunk * (len(self.indices) // chunk)

    def __len__(self) -> int:
        return self.count

    @property
    def has_mask(self) -> bool:
        return self.source.has_mask

    def files(self) -> list[tuple[str, int]]:
        return self.source.files()

    def instance(self, index: int) -> Instance:
        return self.source.instance(int(self.indices[self.check_index(index)]))


def split_instances(source: InstanceSource, ratio: float, idx: int, seed: int | None) -> SlicedInstances:
    """`SplitInstanceSourceConfig.build`: positions before (idx 0) or from `int(ratio * instances)` on."""
    cut = int(ratio * len(source))
    return SlicedInstances(source, 0, cut, seed) if idx == 0 else SlicedInstances(source, cut, None, seed)
