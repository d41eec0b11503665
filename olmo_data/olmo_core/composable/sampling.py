"""OLMo-core's sampling sources: of tokens, of documents, of instances (each resizes its sources to a budget).

* `SamplingTokens` (`SamplingTokenSource`): its sources unwound first (a mixing token source into its sampled
  sources, a sampling one into the sources it took), then each leaf gets `round(max_tokens * leaf / total)`
  tokens (total: the tokens of the sources given, before unwinding): the whole leaf as often as that holds it,
  then one contiguous slice of the rest, starting at 0, or, with a seed, at `rng.integers(0, leaf - rest)` of
  one PCG64(seed) drawn leaf after leaf.
* `SamplingDocs` (`SamplingDocumentSource`): its sources' documents (concatenated), shuffled by PCG64(seed) when
  it has a seed, repeated whole as often as `max_tokens` holds them, then the first documents whose cumulative
  length stays within the rest. Its tokens are those documents end to end; its documents are they.
* `SamplingInstances` (`SamplingInstanceSource`): `int(max_instances * len / total)` instances of each source,
  whole chunks of M // L: the source's `build_global_indices` (seed + i for the i-th source, in order without
  a seed) repeated whole, then its first entries.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import (
    Instance,
    InstanceSource,
    PartedInstances,
    check_instance_masks,
)
from olmo_data.olmo_core.composable.loader import global_indices
from olmo_data.olmo_core.composable.sliced import SlicedTokens
from olmo_data.olmo_core.composable.tokens import Concatenated, Piece, TokenSource, check_masks


def rng_of(seed: int) -> np.random.Generator:
    """OLMo-core's `get_rng`."""
    return np.random.Generator(np.random.PCG64(seed))


class SamplingTokens(TokenSource):
    """OLMo-core's `SamplingTokenSource` (see the module)."""

    def __init__(self, sources: list[TokenSource], max_tokens: int, seed: int | None, label: str | None = None) -> None:
        if max_tokens <= 0:
            raise DataError(f"OLMo-core's SamplingTokenSource of {max_tokens} tokens (it needs more than 0)")
        total = sum(s.num_tokens for s in sources)
        rng = None if seed is None else rng_of(seed)
        frontier = deque(sources)
        final: list[TokenSource] = []
        while frontier:
            source = frontier.popleft()
            unwound = getattr(source, "unwound", None)  # a mixing or sampling token source: its own samples
            if unwound is not None:
                frontier.extend(unwound)
                continue
            n = source.num_tokens
            if n == 0:
                raise DataError("OLMo-core's SamplingTokenSource over a source without tokens fails (a division by 0)")
            size = round(max_tokens * (n / total))
            final.extend([source] * (size // n))
            rest = size % n
            if rest > 0:
                start = 0 if rng is None else int(rng.integers(0, n - rest))
                final.append(SlicedTokens(source, start, start + rest))
        check_masks(final or list(sources), "SamplingTokenSource")
        self.sources = final
        self.label = label
        self.has_mask_ = (final or list(sources))[0].has_mask
        self.joined = Concatenated(final, document=False) if final else None

    @property
    def unwound(self) -> list[TokenSource]:
        return self.sources

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sources)

    @property
    def has_mask(self) -> bool:
        return self.has_mask_

    def files(self) -> list[tuple[str, int]]:
        return [f for s in self.sources for f in s.files()]

    def pieces(self, start: int, end: int) -> list[Piece]:
        if self.joined is None:
            raise DataError(f"tokens {start}..{end} are outside a sample of no tokens")
        return self.joined.pieces(start, end)


class SamplingDocs(TokenSource):
    """OLMo-core's `SamplingDocumentSource` (see the module)."""

    is_document = True

    def __init__(self, sources: list[TokenSource], max_tokens: int, seed: int | None, label: str | None = None) -> None:
        if max_tokens <= 0:
            raise DataError(f"OLMo-core's SamplingDocumentSource of {max_tokens} tokens (it needs more than 0)")
        self.source = sources[0] if len(sources) == 1 else Concatenated(sources, document=True)
        self.label = label
        docs = self.source.documents().astype(np.uint64)
        if seed is not None:
            rng_of(seed).shuffle(docs, axis=0)
        cumulative = np.cumsum(docs[:, 1] - docs[:, 0], dtype=np.uint64)
        total = int(cumulative[-1]) if len(cumulative) else 0
        if total == 0:
            raise DataError("OLMo-core's SamplingDocumentSource over sources without tokens fails (a division by 0)")
        repeats, rest = divmod(max_tokens, total)
        sampled = np.take(docs, np.flatnonzero(cumulative <= rest), axis=0)
        if repeats > 0:
            sampled = np.concatenate([np.tile(docs, (repeats, 1)), sampled])
        if len(sampled) == 0:
            raise DataError(
                f"OLMo-core's SamplingDocumentSource cannot sample {max_tokens:,} tokens of whole documents from "
                f"its sources (it refuses that)"
            )
        self.sampled = sampled.astype(np.int64)  # (n, 2): each sampled document's tokens in the source
        lengths = self.sampled[:, 1] - self.sampled[:, 0]
        self.bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    @property
    def num_tokens(self) -> int:
        return int(self.bounds[-1])

    @property
    def has_mask(self) -> bool:
        return self.source.has_mask

    def files(self) -> list[tuple[str, int]]:
        return self.source.files()

    def documents(self) -> np.ndarray:
        return np.stack([self.bounds[:-1], self.bounds[1:]], axis=1)

    def pieces(self, start: int, end: int) -> list[Piece]:
        if not 0 <= start < end <= self.num_tokens:
            raise DataError(f"tokens {start}..{end} are outside a sample of {self.num_tokens:,} tokens")
        first = int(np.searchsorted(self.bounds, start, side="right")) - 1
        out: list[Piece] = []
        doc = first
        while start < end:
            if self.bounds[doc + 1] > start:  # (an empty document is passed over: it holds no token)
                a = int(self.sampled[doc, 0]) + start - int(self.bounds[doc])
                b = a + min(end, int(self.bounds[doc + 1])) - start
                out += self.source.pieces(a, b)
                start = min(end, int(self.bounds[doc + 1]))
            doc += 1
        return out


class SamplingInstances(PartedInstances):
    """OLMo-core's `SamplingInstanceSource` (see the module)."""

    sources: list[InstanceSource]

    def __init__(
        self,
        sources: list[InstanceSource],
        *,
        max_tokens: int | None = None,
        max_instances: int | None = None,
        seed: int | None,
        label: str | None = None,
    ) -> None:
        L, M = sources[0].sequence_length, sources[0].max_sequence_length
        if max_tokens is not None:
            if max_tokens <= 0:
                raise DataError(f"OLMo-core's SamplingInstanceSource of {max_tokens} tokens (it needs more than 0)")
            max_instances = max_tokens // L
        assert max_instances is not None
        check_instance_masks(sources, "SamplingInstanceSource")
        self.sources, self.label = sources, label
        self.sequence_length, self.max_sequence_length = L, M
        total = sum(len(s) for s in sources)
        chunk = M // L
        self.samples: list[np.ndarray] = []
        for i, source in enumerate(sources):
            if len(source) == 0:
                raise DataError("OLMo-core's SamplingInstanceSource over a source without instances fails")
            size = int(max_instances * (len(source) / total))
            size = chunk * (size // chunk)
            order = global_indices(len(source), L, M, None if seed is None else seed + i)
            repeats, rest = divmod(size, len(source))
            self.samples.append(np.concatenate([np.tile(order, repeats), order[:rest]]).astype(np.int64))
        self.counts = [len(s) for s in self.samples]

    def instance(self, index: int) -> Instance:
        k, local = self.part_of(index)
        return self.sources[k].instance(int(self.samples[k][local]))
