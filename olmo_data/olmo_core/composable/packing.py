"""OLMo-core's `PackingInstanceSource`: whole documents of document sources packed into instances of L tokens.

Its sources are taken in groups of `source_group_size`; each group is packed on its own: the documents of its
sources (each source's `documents()`, a source's tail included, placed after the sources before it), a document
longer than L cut to its first L tokens (`truncate`) or into pieces of L (`fragment`), sorted longest first by
numpy's `argsort` of the negated lengths, and packed by OLMo-core's optimized best-fit decreasing
(`olmo_data.olmo_core.packed.pack_lengths`: each into the open instance with the least room that holds it, the
earliest opened among equals, else a new one). Instances are numbered group after group, in the order they were
opened; each is its documents in the order they went in, padded to L with the packing tokenizer's pad id (its
label mask True on the documents, or their files' masks, and False on the padding).

OLMo-core keeps each group's packing in `work_dir/PackingInstanceSource`, named by a digest of its sources'
fingerprints; it is deterministic from the config and the token files, so it is rebuilt here, never read.
"""

from __future__ import annotations

import numpy as np

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import Instance, PartedInstances
from olmo_data.olmo_core.composable.tokens import Piece, TokenSource
from olmo_data.olmo_core.packed import cut_long, pack_lengths


class PackedGroup:
    """One group's packing: its documents (longest first, in the group's tokens) and each instance's documents."""

    def __init__(self, sources: list[TokenSource], L: int, strategy: str) -> None:
        self.sources = sources
        self.starts = np.cumsum([0] + [s.num_tokens for s in sources]).tolist()
        parts = [cut_long(s.documents(), L, strategy) + start for s, start in zip(sources, self.starts, strict=False)]
        docs = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
        lengths = docs[:, 1] - docs[:, 0]
        if len(lengths) and int(lengths.min()) <= 0:
            raise DataError(
                "OLMo-core's PackingInstanceSource over an empty document fails (its packer cannot place one)"
            )
        self.documents = np.take(docs, np.argsort(-1 * lengths.astype(np.int64)), axis=0)
        self.bins = pack_lengths(self.documents[:, 1] - self.documents[:, 0], L)

    def pieces(self, instance: int) -> list[Piece]:
        out: list[Piece] = []
        for doc in self.bins[instance]:
            start, end = (int(x) for x in self.documents[doc])
            k = int(np.searchsorted(self.starts, start, side="right")) - 1
            out += self.sources[k].pieces(start - self.starts[k], end - self.starts[k])
        return out


class Packing(PartedInstances):
    """OLMo-core's `PackingInstanceSource` (see the module)."""

    def __init__(
        self,
        sources: list[TokenSource],
        sequence_length: int,
        pad_token_id: int,
        *,
        long_doc_strategy: str = "truncate",
        source_group_size: int = 1,
        label: str | None = None,
    ) -> None:
        if sequence_length & (sequence_length - 1):
            raise DataError(f"OLMo-core's packer needs a power-of-two sequence_length, not {sequence_length}")
        self.sequence_length = self.max_sequence_length = sequence_length
        self.pad_token_id, self.label = pad_token_id, label
        size = source_group_size
        self.groups = [
            PackedGroup(sources[i : i + size], sequence_length, long_doc_strategy) for i in range(0, len(sources), size)
        ]
        self.counts = [len(g.bins) for g in self.groups]
        self.sources = sources

    @property
    def has_mask(self) -> bool:
        return True  # OLMo-core gives every packed instance a label mask (False on its padding)

    def instance(self, index: int) -> Instance:
        g, local = self.part_of(index)
        return Instance(tuple(self.groups[g].pieces(local)), pad=self.pad_token_id)
