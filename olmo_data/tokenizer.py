"""Tokenizer backends behind one small interface.

`load_tokenizer(spec)` takes a `tokenizer.json` path, a `.tiktoken` ranks file, or a Hugging Face hub id, and
returns a `Tokenizer`. Encoding never adds special tokens: the tokenize stage adds BOS/EOS itself so that the
rule is the same for every backend.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from olmo_data.errors import DataError

log = logging.getLogger(__name__)

Backend = Literal["auto", "tiktoken", "hf"]
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

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        if self.hf is None:
            return str(self._decode(list(map(int, ids))))
        return str(self.hf.decode(list(map(int, ids)), skip_special_tokens=False))

    def set_num_threads(self, num_threads: int) -> None:
        """Threads one `encode_batch` call may use (tiktoken backend; default 1, as the tokenize stage runs
        one process per core). HF `tokenizers` sizes its own pool (RAYON_NUM_THREADS, TOKENIZERS_PARALLELISM).
        """
        if hasattr(self._encode_batch, "num_threads"):
            self._encode_batch.num_threads = max(1, int(num_threads))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for worker processes: a tiktoken-backed tokenizer leaves the HF tokenizer behind (slow to
        serialise and rebuild for large vocabularies) and decodes with tiktoken, which gives the same bytes."""
        state = dict(self.__dict__)
        if self.backend == "tiktoken" and hasattr(self._encode_batch, "decode"):
            state.update(hf=None, _decode=self._encode_batch.decode)
        return state

    def identity(self) -> dict[str, Any]:
        """What a manifest records about the tokenizer."""
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "backend": self.backend,
        }


def _find_special(hf: Any, candidates: Sequence[str]) -> int | None:
    for tok in candidates:
        tid = hf.token_to_id(tok)
        if tid is not None:
            return int(tid)
    return None


def _load_hf(spec: str) -> tuple[Any, str, str, str]:
    """Load a `tokenizers.Tokenizer` from a path or hub id; returns (tokenizer, name, sha256 of its JSON, JSON)."""
    from tokenizers import Tokenizer as HFTokenizer

    if os.path.isfile(spec):
        with open(spec, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
            hf = HFTokenizer.from_str(text)
        except Exception as e:
            raise DataError(f"{spec}: not a Hugging Face tokenizer.json ({e})") from e
        return hf, os.path.basename(spec), hashlib.sha256(data).hexdigest(), text
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "tokenizer.json")):
        return _load_hf(os.path.join(spec, "tokenizer.json"))
    if os.path.sep in spec and not spec.count("/") == 1 or spec.endswith(".json"):
        raise DataError(f"{spec}: tokenizer file not found")
    from olmo_data.io import hub_offline_mode, hub_reachable

    if not hub_offline_mode() and not hub_reachable():
        raise DataError(
            f"{spec}: no such tokenizer file or directory here, and the Hugging Face hub cannot be reached to load it "
            "as a hub id (offline?); check the name, or give a local tokenizer.json path"
        )
    try:
        hf = HFTokenizer.from_pretrained(spec)
    except Exception as e:
        raise DataError(
            f"{spec}: could not load tokenizer from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Offline? Give a local tokenizer.json path instead."
        ) from e
    text = hf.to_str()
    return hf, spec, hashlib.sha256(text.encode("utf-8")).hexdigest(), text


def load_tokenizer(spec: str, backend: Backend = "auto") -> Tokenizer:
    """Load `spec` and pick the fastest backend that gives identical ids.

    `auto` uses tiktoken where an exact equivalent can be built and passes the start-up self-check, else HF
    `tokenizers`; `tiktoken` insists on it (error when impossible); `hf` always uses `tokenizers`.
    """
    if backend not in ("auto", "tiktoken", "hf"):
        raise DataError(f"unknown tokenizer backend {backend!r}; expected auto, tiktoken or hf")
    spec = os.path.expanduser(str(spec))
    tok = _load(spec, backend)
    tok.path = os.path.abspath(spec) if os.path.exists(spec) else spec
    return tok


def _load(spec: str, backend: Backend) -> Tokenizer:
    if spec.endswith(".tiktoken"):
        from olmo_data import tiktoken_backend

        if backend == "hf":
            raise DataError(f"{spec}: a .tiktoken ranks file runs on the tiktoken backend only; use auto")

        return tiktoken_backend.load_tiktoken_file(spec)
    if backend != "hf":
        local = spec if os.path.isfile(spec) else os.path.join(spec, "tokenizer.json")
        if os.path.isfile(local):
            from olmo_data import tiktoken_backend

            with open(local, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            cached = tiktoken_backend.load_checked(digest, os.path.basename(local))
            if cached is not None:
                return cached
    hf, name, sha, json_text = _load_hf(spec)
    tok = Tokenizer(
        name=name,
        sha256=sha,
        vocab_size=int(hf.get_vocab_size(with_added_tokens=True)),
        backend="hf",
        eos_token_id=_find_special(hf, EOS_CANDIDATES),
        bos_token_id=_find_special(hf, BOS_CANDIDATES),
        pad_token_id=_find_special(hf, PAD_CANDIDATES),
        hf=hf,
    )
    if backend == "hf":
        return tok
    from olmo_data import tiktoken_backend

    fast = tiktoken_backend.try_tiktoken(tok, strict=backend == "tiktoken", json_text=json_text)
    return fast if fast is not None else tok
