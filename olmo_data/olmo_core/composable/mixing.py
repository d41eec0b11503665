"""OLMo-core's mixing sources: of tokens, of documents, of instances (sources sampled to target ratios).

Each mixes its specs' sources (a spec's sources concatenated when its config built several) in the sizes of
OLMo-core's `calculate_sample_sizes` (`sample_sizes` here: ratios normalised, each source repeated at most its
`max_repetition_factor`, all scaled down together until every source can give its share; with a target size,
a mix that cannot reach it is refused, as OLMo-core refuses it), then samples each with its sampling source
(seed + i for the i-th spec, no shuffling without a seed) and puts the samples one after the other.
"""

from __future__ import annotations

import numpy as np

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import ConcatenatedInstances, Instance, InstanceSource
from olmo_data.olmo_core.composable.sampling import SamplingDocs, SamplingInstances, SamplingTokens
from olmo_data.olmo_core.composable.tokens import Concatenated, Piece, TokenSource


def sample_sizes(
    sizes: list[int], ratios: list[float], repetitions: list[float], target: int | None, what: str
) -> list[int]:
    """OLMo-core's `calculate_sample_sizes`, in its own float64 steps (so each size is the same whole number)."""
    if min(sizes) <= 0:
        raise DataError(f"{what}: a source of the mix has no {'tokens'} (OLMo-core refuses a mix over it)")
    ratio = np.array(ratios)
    size = np.array(sizes)
    reps = np.array(repetitions)
    strict = target is not None
    goal = size.sum() if target is None else target
    if not np.allclose(ratio.sum(), 1.0):
        ratio = ratio / ratio.sum()
    ideal = goal * ratio
    needed = np.maximum(ideal / size, 1.0)
    usable = size * np.minimum(reps, needed)
    actual = ideal * min(1.0, (usable / ideal).min())
    if not np.allclose(ratio, actual / actual.sum()):
        raise DataError(f"{what}: OLMo-core's mix sizes do not keep the ratios {ratios} (it fails on this mix)")
    out = actual.astype(np.uint64)
    if not (out <= usable).all() or (strict and not np.allclose(goal, actual.sum())):
        raise DataError(
            f"{what}: the mix cannot reach {goal:,} with these ratios and max_repetition_factor values (the best is "
            f"{int(actual.sum()):,}); OLMo-core refuses it"
        )
    return [int(x) for x in out]


class MixingTokens(TokenSource):
    """OLMo-core's `MixingTokenSource` (or, with `document`, `MixingDocumentSource`)."""

    def __init__(
        self,
        specs: list[tuple[TokenSource, float, float]],
        *,
        document: bool,
        seed: int | None,
        num_tokens: int | None,
        label: str | None = None,
        what: str = "a mix",
    ) -> None:
        sizes = sample_sizes(
            [s.num_tokens for s, _, _ in specs], [r for _, r, _ in specs], [m for _, _, m in specs], num_tokens, what
        )
        sampled: list[TokenSource] = []
        for i, ((source, _, _), size) in enumerate(zip(specs, sizes, strict=True)):
            seed_i = None if seed is None else seed + i
            sampled.append(SamplingDocs([source], size, seed_i) if document else SamplingTokens([source], size, seed_i))
        self.sampled = sampled
        self.joined = Concatenated(sampled, document=document)
        self.is_document = document
        self.label = label

    @property
    def unwound(self) -> list[TokenSource] | None:
        """A token mix is unwound into its samples by a sampling token source (a document mix is not)."""
        return None if self.is_document else self.sampled

    @property
    def num_tokens(self) -> int:
        return self.joined.num_tokens

    @property
    def has_mask(self) -> bool:
        return self.joined.has_mask

    def files(self) -> list[tuple[str, int]]:
        return self.joined.files()

    def pieces(self, start: int, end: int) -> list[Piece]:
        return self.joined.pieces(start, end)

    def documents(self) -> np.ndarray:
        return self.joined.documents()


class MixingInstances(InstanceSource):
    """OLMo-core's `MixingInstanceSource`: sizes in tokens (`num_instances` as that many instances of L)."""

    def __init__(
        self,
        specs: list[tuple[InstanceSource, float, float]],
        *,
        seed: int | None,
        num_tokens: int | None,
        num_instances: int | None,
        label: str | None = None,
        what: str = "a mix",
    ) -> None:
        L = specs[0][0].sequence_length
        if num_instances is not None:
            num_tokens = num_instances * L
        sizes = sample_sizes(
            [s.num_tokens for s, _, _ in specs], [r for _, r, _ in specs], [m for _, _, m in specs], num_tokens, what
        )
        sampled: list[InstanceSource] = [
            SamplingInstances([source], max_tokens=size, seed=None if seed is None else seed + i)
            for i, ((source, _, _), size) in enumerate(zip(specs, sizes, strict=True))
        ]
        self.joined = ConcatenatedInstances(sampled)
        self.sequence_length, self.max_sequence_length = L, specs[0][0].max_sequence_length
        self.label = label

    def __len__(self) -> int:
        return len(self.joined)

    @property
    def has_mask(self) -> bool:
        return self.joined.has_mask

    def files(self) -> list[tuple[str, int]]:
        return self.joined.files()

    def instance(self, index: int) -> Instance:
        return self.joined.instance(index)
