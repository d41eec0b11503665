"""OLMo-core's `RandomInstanceSource`: instances of random tokens (for benchmarks), each made from its seed alone.

Its `num_tokens` (or `num_instances` of L) is cut to whole runs of M = max_sequence_length; run `b` of M tokens
is drawn by PCG64(seed + b): M ids below the tokenizer's vocab_size (as the smallest unsigned dtype whose maximum
reaches the vocab_size), the EOS, pad and BOS ids among them replaced by the first id that is none of those, the
last token an EOS (the first a BOS, with one), and `max(1, round(integers(-3, 3) + M / avg_document_length))`
documents: an EOS (and a BOS after it) at the first `documents - 1` entries of a permutation of the positions
between. An instance of L < M is the run's L tokens at its place. It has no file and no label mask.
"""

from __future__ import annotations

import numpy as np

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import Instance, InstanceSource
from olmo_data.olmo_core.composable.spec import Tokenizer


class RandomInstances(InstanceSource):
    """OLMo-core's `RandomInstanceSource` (see the module)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        sequence_length: int,
        max_sequence_length: int,
        avg_document_length: int,
        seed: int,
        *,
        num_tokens: int | None,
        num_instances: int | None,
        label: str | None = None,
    ) -> None:
        L, M = sequence_length, max_sequence_length
        tokens = num_tokens if num_tokens is not None else int(num_instances or 0) * L
        self.sequence_length, self.max_sequence_length = L, M
        self.tokenizer, self.avg, self.seed, self.label = tokenizer, avg_document_length, seed, label
        self.num_tokens_ = M * (tokens // M)
        vocab = tokenizer.vocab_size
        self.dtype = next((d for d in (np.uint8, np.uint16, np.uint32) if np.iinfo(d).max >= vocab), np.uint64)
        special = (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id)
        plain = [t for t in range(min(vocab, 4)) if t not in special]
        if not plain:
            raise DataError(f"OLMo-core's RandomInstanceSource over a vocabulary of {vocab} special ids fails")
        self.plain = plain[0]

    def __len__(self) -> int:
        return self.num_tokens_ // self.sequence_length

    @property
    def has_mask(self) -> bool:
        return False

    def files(self) -> list[tuple[str, int]]:
        return []

    def instance(self, index: int) -> Instance:
        L, M = self.sequence_length, self.max_sequence_length
        index = self.check_index(index)
        per = M // L
        rng = np.random.Generator(np.random.PCG64(self.seed + (index // per if L < M else index)))
        tok = self.tokenizer
        tokens = rng.integers(0, tok.vocab_size, M, dtype=self.dtype)
        tokens[tokens == tok.eos_token_id] = self.plain
        tokens[tokens == tok.pad_token_id] = self.plain
        if tok.bos_token_id is not None:
            tokens[tokens == tok.bos_token_id] = self.plain
        documents = max(1, round(rng.integers(-3, 3) + M / self.avg))
        tokens[-1] = tok.eos_token_id
        if tok.bos_token_id is not None:
            tokens[0] = tok.bos_token_id
        if documents > 1:
            buffer = 1 if tok.bos_token_id is None else 2
            bounds = buffer + rng.permutation(M - 2 * buffer - 1)[: documents - 1]
            tokens[bounds] = tok.eos_token_id
            if tok.bos_token_id is not None:
                tokens[bounds + 1] = tok.bos_token_id
        if L < M:
            at = index % per * L
            tokens = tokens[at : at + L]
        return Instance((), tokens=tokens.astype(np.int64))
