"""`load_tokenizer`: one entry point for every backend, picking the fastest one that gives identical ids."""

from __future__ import annotations

import hashlib
import os

from olmo_data.errors import DataError
from olmo_data.tokenizer.base import BACKENDS, Backend, Tokenizer
from olmo_data.tokenizer.hf import load_hf_tokenizer
from olmo_data.tokenizer.tiktoken_backend import load_tiktoken_file, try_tiktoken
from olmo_data.tokenizer.tiktoken_cache import load_checked


def load_tokenizer(spec: str, backend: Backend = "auto") -> Tokenizer:
    """Load `spec` (a `tokenizer.json` path, a `.tiktoken` ranks file, or a Hugging Face hub id) and pick the
    fastest backend that gives identical ids.

    `auto` uses the fastest installed engine (quicktok, fastokens, riptoken, then tiktoken) where an exact equivalent
    can be built and passes the start-up self-check, else HF `tokenizers`; naming an engine insists on it (an error
    where it cannot: fastokens runs a tokenizer.json only); `hf` always uses `tokenizers`.
    """
    if backend not in BACKENDS:
        raise DataError(f"unknown tokenizer backend {backend!r}; expected {', '.join(BACKENDS[:-1])} or hf")
    spec = os.path.expanduser(str(spec))
    tok = _load(spec, backend)
    tok.path = os.path.abspath(spec) if os.path.exists(spec) else spec
    return tok


def _load(spec: str, backend: Backend) -> Tokenizer:
    if spec.endswith(".tiktoken"):
        if backend == "hf" or backend == "fastokens":
            raise DataError(
                f"{spec}: a .tiktoken ranks file runs on the quicktok, riptoken or tiktoken backend only; use auto"
            )
        return load_tiktoken_file(spec, engine=None if backend == "auto" else backend)
    if backend == "hf":
        return load_hf_tokenizer(spec)[0]
    engine = None if backend == "auto" else backend
    local = spec if os.path.isfile(spec) else os.path.join(spec, "tokenizer.json")
    if os.path.isfile(local):
        with open(local, "rb") as f:
            data = f.read()
        cached = load_checked(hashlib.sha256(data).hexdigest(), os.path.basename(local), engine, json_bytes=data)
        if cached is not None:
            return cached
    tok, json_text = load_hf_tokenizer(spec)
    fast = try_tiktoken(tok, strict=engine is not None, json_text=json_text, engine=engine)
    return fast if fast is not None else tok
