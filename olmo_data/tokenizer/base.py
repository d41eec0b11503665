"""The interface every tokenizer backend returns: a `Tokenizer`, and the special tokens it is searched for.

Both backends (`hf`, `tiktoken_backend`) build this same object, so the rest of the library never asks which one
it has. Encoding never adds special tokens: the tokenize stage adds BOS/EOS itself so that the rule is the same
for every backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Backend = Literal["auto", "quicktok", "fastokens", "riptoken", "tiktoken", "hf"]
# as --backend names them
BACKENDS: tuple[Backend, ...] = ("auto", "quicktok", "fastokens", "riptoken", "tiktoken", "hf")
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
PAD_CANDIDATES = ("<|padding|>", "<|pad|>", "<pad>")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>")


@dataclass
class Tokenizer:
    """A loaded tokenizer: identity (for manifests), special ids, and a batch encoder.

    `encode_batch` is the hot path; it returns one list of ids per text, special tokens not added.
    """

    name: str
    sha256: str
    vocab_size: int
    backend: str
    eos_token_id: int | None
    bos_token_id: int | None
    pad_token_id: int | None
    hf: Any = field(repr=False)  # `tokenizers.Tokenizer`: decoding and the reference; None for .tiktoken
    _encode_batch: Any = field(repr=False, default=None)
    _decode: Any = field(repr=False, default=None)  # used when there is no `hf` (a .tiktoken file)
    path: str = ""  # where it was loaded from (absolute path or hub id), so readers of a manifest can find it

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._encode_batch is not None:
            return self._encode_batch(texts)  # type: ignore[no-any-return]
        return [e.ids for e in self.hf.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_each(self, texts: Sequence[str]) -> Iterator[list[int]]:
        """`encode_batch`'s lists one at a time: on the engines, each is made when asked for, so a caller that copies
        the ids out (the tokenize stage) holds one text's ids at a time instead of a batch's."""
        each = getattr(self._encode_batch, "each", None)
        if each is not None:
            return each(texts)  # type: ignore[no-any-return]
        return iter(self.encode_batch(texts))

    def encode_flat(self, texts: Sequence[str]) -> tuple[Any, Any] | None:
        """`encode_batch`'s ids as one numpy uint32 array and int64 offsets (text i's ids are
        tokens[offsets[i]:offsets[i + 1]]), where the engine has a batch call that gives them so (quicktok: no Python
        lists), else None."""
        flat = getattr(self._encode_batch, "flat", None)
        return None if flat is None else flat(texts)  # type: ignore[no-any-return]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        if self.hf is None:
            return str(self._decode(list(map(int, ids))))
        return str(self.hf.decode(list(map(int, ids)), skip_special_tokens=False))

    def set_num_threads(self, num_threads: int) -> None:
        """Threads one `encode_batch` call may use (the engine backends; default 1, as the tokenize stage
        runs one process per core). HF `tokenizers` sizes its own pool (RAYON_NUM_THREADS, TOKENIZERS_PARALLELISM).
        """
        if hasattr(self._encode_batch, "num_threads"):
            self._encode_batch.num_threads = max(1, int(num_threads))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for worker processes: a tiktoken-backed tokenizer leaves the HF tokenizer behind (slow to
        serialise and rebuild for large vocabularies) and decodes with tiktoken, which gives the same bytes."""
        state = dict(self.__dict__)
        if self.backend in ("quicktok", "fastokens", "riptoken", "tiktoken") and hasattr(self._encode_batch, "decode"):
            state.update(hf=None, _decode=self._encode_batch.decode)
        return state

    def ready(self) -> None:
        """Wait for an engine that loads on a thread of its own (fastokens) to have loaded: before a fork, which
        copies no threads, so that the workers inherit the loaded engine. Raises what loading it raised."""
        ready = getattr(self._encode_batch, "ready", None)
        if ready is not None:
            ready()

    def loading(self) -> bool:
        """Whether an engine that loads on a thread of its own is still loading (never blocks): the tokenize stage
        reads its first inputs meanwhile (`tokenize.reading.read_ahead`)."""
        loading = getattr(self._encode_batch, "loading", None)
        return bool(loading()) if loading is not None else False

    def identity(self) -> dict[str, Any]:
        """What a manifest records about the tokenizer."""
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "backend": self.backend,
        }
