"""OLMo-core's token and document sources over numpy token files: `NumpyDocumentSource` and the concatenations.

A token source is an array of tokens; here it answers where its tokens [start, end) live, as `Piece`s (a file,
its dtype and label mask file, a range of it), so that a batch is read in one round and every instance can name
the files it came from. A document source also gives OLMo-core's document offsets (`documents`).

* `NumpyDocs` (OLMo-core's `NumpyDocumentSource`): its files' tokens end to end. Documents are found per file as
  OLMo-core's `iter_document_indices` finds them (in a local file by its EOS, with a BOS id where an EOS is
  followed by the BOS; in a remote one from the `.csv.gz` beside it), cut at `max_document_length` when that is
  set, and a file's tail after its last document is one more document (OLMo-core always ends one at a file's
  end).
* `Concatenated` (`ConcatenatedTokenSource`, `ConcatenatedDocumentSource`): its sources end to end, nested
  concatenations flattened as OLMo-core flattens them.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import replace
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from olmo_data.errors import DataError
from olmo_data.io import file_sizes
from olmo_data.olmo_core.config import NUMPY_DTYPES, OlmoCoreRun, local_path
from olmo_data.olmo_core.packed import cut_long, document_bounds, metadata_bounds


class Piece(NamedTuple):
    """Tokens [start, end) of a token file read as `dtype` (its label mask file, when it has one)."""

    path: str
    dtype: str
    mask: str | None
    start: int
    end: int


class TokenSource:
    """What every token source answers (see the module)."""

    label: str | None = None
    is_document = False  # a DocumentSource: it has `documents()`

    @property
    def num_tokens(self) -> int:
        raise NotImplementedError

    @property
    def has_mask(self) -> bool:
        """Whether its token ranges come with a label mask (OLMo-core adds one only where a file has one)."""
        raise NotImplementedError

    def pieces(self, start: int, end: int) -> list[Piece]:
        """Where tokens [start, end) (0 <= start < end <= num_tokens) live, in order."""
        raise NotImplementedError

    def documents(self) -> np.ndarray:
        """(n, 2) start/end of each document, in order, covering the tokens (a document source's)."""
        raise DataError(f"OLMo-core's {type(self).__name__} is a token source, not a document source")

    def files(self) -> list[tuple[str, int]]:
        """(path, tokens) of the token files it reads, in order, for the run's file list."""
        raise NotImplementedError


def split_range(sizes: list[int], start: int, end: int) -> list[tuple[int, int, int]]:
    """(child, start, end) of each child (of `sizes` tokens, end to end) that tokens [start, end) fall in."""
    bounds = list(accumulate(sizes, initial=0))
    if not 0 <= start < end <= bounds[-1]:
        raise DataError(f"tokens {start}..{end} are outside a source of {bounds[-1]:,} tokens")
    out = []
    k = bisect_right(bounds, start) - 1
    while start < end:
        while sizes[k] == 0 or bounds[k + 1] <= start:
            k += 1
        stop = min(end, bounds[k + 1])
        out.append((k, start - bounds[k], stop - bounds[k]))
        start = stop
    return out


def with_tail(docs: np.ndarray, size: int) -> np.ndarray:
    """Documents of a source, with its tail after the last one as one more (OLMo-core's rule at a source's end).
    OLMo-core asserts that they follow each other from 0: documents truncated at max_document_length leave gaps
    it fails on, so they are refused."""
    docs = docs.reshape(-1, 2)
    starts = np.concatenate([[0], docs[:-1, 1]]) if len(docs) else np.zeros(0, dtype=np.int64)
    gap = np.flatnonzero(docs[:, 0] != starts)
    if gap.size:
        raise DataError(
            f"OLMo-core's document source fails on documents that do not follow each other (document {int(gap[0])} "
            f"starts at token {int(docs[gap[0], 0]):,}, not {int(starts[gap[0]]):,}: max_document_length with "
            "long_doc_strategy truncate); not covered"
        )
    last = int(docs[-1, 1]) if len(docs) else 0
    if last != size:
        docs = np.concatenate([docs.reshape(-1, 2), np.array([[last, size]], dtype=np.int64)])
    return docs.astype(np.int64).reshape(-1, 2)


class NumpyDocs(TokenSource):
    """OLMo-core's `NumpyDocumentSource` over files of `dtype` tokens (see the module)."""

    is_document = True

    def __init__(
        self,
        paths: tuple[str, ...],
        sizes: tuple[int, ...],
        masks: tuple[str, ...] | None,
        run: OlmoCoreRun,
        *,
        max_document_length: int | None = None,
        long_doc_strategy: str = "truncate",
        label: str | None = None,
    ) -> None:
        self.paths, self.sizes, self.masks = paths, sizes, masks
        self.run = run  # its dtype, EOS and BOS ids (this source's tokenizer), for finding documents
        self.max_document_length = max_document_length
        self.long_doc_strategy = long_doc_strategy
        self.label = label
        self._documents: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)

    @property
    def has_mask(self) -> bool:
        return self.masks is not None

    def files(self) -> list[tuple[str, int]]:
        return list(zip(self.paths, self.sizes, strict=True))

    def pieces(self, start: int, end: int) -> list[Piece]:
        masks = self.masks
        return [
            Piece(self.paths[k], self.run.dtype, masks[k] if masks is not None else None, a, b)
            for k, a, b in split_range(list(self.sizes), start, end)
        ]

    def split(self, group_size: int) -> list[NumpyDocs]:
        """`split_by_source`: one source per `group_size` files. OLMo-core 3.0.0 does not hand the groups its
        max_document_length and long_doc_strategy, so they find documents without them."""
        out = []
        for i in range(0, len(self.paths), group_size):
            masks = self.masks[i : i + group_size] if self.masks is not None else None
            out.append(NumpyDocs(self.paths[i : i + group_size], self.sizes[i : i + group_size], masks, self.run))
            out[-1].label = self.label
        return out

    def documents(self) -> np.ndarray:
        if self._documents is None:
            parts, offset = [], 0
            for path, n in zip(self.paths, self.sizes, strict=True):
                if n == 0:
                    found = np.zeros((0, 2), dtype=np.int64)
                elif local_path(path):
                    found = document_bounds(self.run, path, n)
                else:
                    found = metadata_bounds(path, n)
                if self.max_document_length is not None:
                    found = cut_long(found, self.max_document_length, self.long_doc_strategy)
                parts.append(with_tail(found, n) + offset)
                offset += n
            self._documents = np.concatenate(parts)
        return self._documents


class Concatenated(TokenSource):
    """OLMo-core's `ConcatenatedTokenSource` (or, with `is_document`, `ConcatenatedDocumentSource`)."""

    sources: list[TokenSource]

    def __init__(self, sources: list[TokenSource], *, document: bool, label: str | None = None) -> None:
        flat: list[TokenSource] = []
        for s in sources:  # OLMo-core unravels every concatenation it is given (either kind)
            flat.extend(s.sources if isinstance(s, Concatenated) else [s])
        self.sources = flat
        self.is_document = document
        self.label = label
        check_masks(flat, "ConcatenatedTokenSource")

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sources)

    @property
    def has_mask(self) -> bool:
        return self.sources[0].has_mask

    def files(self) -> list[tuple[str, int]]:
        return [f for s in self.sources for f in s.files()]

    def pieces(self, start: int, end: int) -> list[Piece]:
        sizes = [s.num_tokens for s in self.sources]
        return [p for k, a, b in split_range(sizes, start, end) for p in self.sources[k].pieces(a, b)]

    def documents(self) -> np.ndarray:
        if not self.is_document:
            return super().documents()
        parts, offset = [], 0
        for s in self.sources:
            parts.append(with_tail(s.documents(), s.num_tokens) + offset)
            offset += s.num_tokens
        return np.concatenate(parts)


def check_masks(sources: list[TokenSource], what: str) -> None:
    """OLMo-core joins its children's label masks only where they have one: children with and without masks
    would give a mask shorter than the tokens, so such a run is refused."""
    if len({s.has_mask for s in sources}) > 1:
        raise DataError(
            f"OLMo-core's {what} over sources with and without label_mask_paths: its label masks would not line "
            "up with its tokens; not covered"
        )


def open_numpy(
    paths: tuple[str, ...],
    masks: tuple[str, ...] | None,
    run: OlmoCoreRun,
    where: str,
    **kw: object,
) -> NumpyDocs:
    """A `NumpyDocs` over these files, sized as OLMo-core sizes them (bytes // itemsize; a directory refused, a
    label mask of another length refused as OLMo-core refuses it)."""
    for p in paths + (masks or ()):
        if local_path(p) and os.path.isdir(p):
            raise DataError(f"{where}: {p} is a directory; OLMo-core reads each entry as one token file")
    try:
        sizes = file_sizes(list(paths) + list(masks or ()))
    except OSError as e:
        raise DataError(f"{where}: a token file cannot be read ({e}); check its source_paths") from e
    itemsize = np.dtype(NUMPY_DTYPES[run.dtype]).itemsize
    tokens = tuple(int(s or 0) // itemsize for s in sizes[: len(paths)])
    for m, n, t, p in zip(masks or (), sizes[len(paths) :], tokens, paths, strict=False):
        if n != t:
            raise DataError(f"{where}: label mask {m} has {n:,} entries but its token file {p} has {t:,} tokens")
    return NumpyDocs(paths, tokens, masks, run, **kw)  # type: ignore[arg-type]


def source_run(run: OlmoCoreRun, dtype: str, eos: int, bos: int | None) -> OlmoCoreRun:
    """The run as one numpy source reads its files: its own dtype and tokenizer's EOS/BOS ids, documents found
    from the token array of a local file (OLMo-core's composable sources never ask for the metadata there)."""
    return replace(run, dtype=dtype, eos_token_id=eos, bos_token_id=bos, use_array_if_local=None)
