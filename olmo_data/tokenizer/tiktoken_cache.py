"""A cache of checked tiktoken plans.

Building the plan from a large tokenizer.json and loading the HF tokenizer for the self-check take most of a
second (cl100k); both are deterministic given the file's bytes and the library versions, so once a plan has passed
the self-check it is stored under the file's SHA-256 and later loads skip both. The cache holds plain numpy arrays
and JSON (no pickle): a damaged or foreign file is ignored.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os

from olmo_data import __version__
from olmo_data.io import atomic_path, default_cache_dir
from olmo_data.tokenizer.base import Tokenizer
from olmo_data.tokenizer.tiktoken_encoder import DEFAULT_NUM_THREADS, TiktokenEncoder, build_encoding
from olmo_data.tokenizer.tiktoken_plan import Plan

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
# The code that builds, checks and runs a plan: a change to any of it invalidates every cached plan.
CODE_FILES = ("tiktoken_plan.py", "tiktoken_encoder.py", "tiktoken_backend.py", "tiktoken_cache.py")


def _cache_file(sha256: str) -> str:
    return os.path.join(default_cache_dir(), "tiktoken", f"{sha256}.npz")


def _cache_versions() -> dict[str, str]:
    import tiktoken
    import tokenizers

    code = hashlib.sha256()
    for name in CODE_FILES:
        with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
            code.update(f.read())
    return {
        "format": str(CACHE_FORMAT),
        "code": code.hexdigest(),
        "olmo_data": __version__,
        "tiktoken": tiktoken.__version__,
        "tokenizers": tokenizers.__version__,
    }


def save_checked(tok: Tokenizer, plan: Plan) -> None:
    """Store a self-checked plan (and the tokenizer's identity and special ids) for `load_checked`."""
    import numpy as np

    items = sorted(plan.ranks.items(), key=lambda kv: kv[1])
    meta = {
        "versions": _cache_versions(),
        "name": tok.name,
        "sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "pad_token_id": tok.pad_token_id,
        "pat_str": plan.pat_str,
        "nfc": plan.nfc,
        "raw_tokens": plan.raw_tokens,
        "normalized_tokens": plan.normalized_tokens,
    }
    path = _cache_file(tok.sha256)
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                blob=np.frombuffer(b"".join(k for k, _ in items), dtype=np.uint8),
                lengths=np.array([len(k) for k, _ in items], dtype=np.int64),
                ids=np.array([v for _, v in items], dtype=np.int64),
            )
    except OSError as e:  # a read-only home or a full disk only costs speed
        log.debug("could not cache the tiktoken plan at %s: %s", path, e)


def load_checked(sha256: str, name: str, num_threads: int = DEFAULT_NUM_THREADS) -> Tokenizer | None:
    """The tiktoken-backed tokenizer stored by `save_checked` for this file hash (named `name`), or None."""
    import numpy as np

    path = _cache_file(sha256)
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes())
            blob, lengths, ids = z["blob"].tobytes(), z["lengths"].tolist(), z["ids"].tolist()
        if meta.get("versions") != _cache_versions() or meta.get("sha256") != sha256:
            return None
        ends = itertools.accumulate(lengths)
        starts = itertools.chain([0], itertools.accumulate(lengths))
        ranks = {blob[a:b]: i for a, b, i in zip(starts, ends, ids, strict=False)}
        plan = Plan(
            pat_str=meta["pat_str"],
            ranks=ranks,
            nfc=bool(meta["nfc"]),
            raw_tokens={k: int(v) for k, v in meta["raw_tokens"].items()},
            normalized_tokens={k: int(v) for k, v in meta["normalized_tokens"].items()},
        )
        encoder = TiktokenEncoder(build_encoding(name, plan), plan, num_threads)
    except Exception as e:  # damaged, truncated or foreign: rebuild from the tokenizer.json
        log.debug("ignoring the tiktoken cache %s: %s", path, e)
        return None
    return Tokenizer(
        name=name,
        sha256=sha256,
        vocab_size=int(meta["vocab_size"]),
        backend="tiktoken",
        eos_token_id=meta["eos_token_id"],
        bos_token_id=meta["bos_token_id"],
        pad_token_id=meta["pad_token_id"],
        hf=None,
        _encode_batch=encoder,
        _decode=encoder.decode,
    )
