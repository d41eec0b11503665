"""A cache of checked engine plans.

Building the plan from a large tokenizer.json and loading the HF tokenizer for the self-check take most of a
second (cl100k); both are deterministic given the file's bytes and the library versions, so once a plan has passed
the self-check on an engine it is stored under the file's SHA-256 and the engine's name, and later loads skip
both. An entry also records the engines `auto` tried first and found unusable, so that `auto` takes an entry only
when it would have chosen that engine itself (versions of every engine installed are part of the key: installing
riptoken invalidates the entries made without it). The cache holds plain numpy arrays and JSON (no pickle): a
damaged or foreign file is ignored.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Sequence

from olmo_data import __version__
from olmo_data.io import atomic_path, default_cache_dir
from olmo_data.tokenizer.base import Tokenizer
from olmo_data.tokenizer.engines import ENGINES, Engine, available
from olmo_data.tokenizer.tiktoken_encoder import DEFAULT_NUM_THREADS, TiktokenEncoder
from olmo_data.tokenizer.tiktoken_plan import Plan

log = logging.getLogger(__name__)

CACHE_FORMAT = 2
# The code that builds, checks and runs a plan: a change to any of it invalidates every cached plan.
CODE_FILES = ("tiktoken_plan.py", "tiktoken_encoder.py", "tiktoken_backend.py", "tiktoken_cache.py", "engines.py")


def _cache_file(sha256: str, engine: Engine) -> str:
    return os.path.join(default_cache_dir(), "tiktoken", f"{sha256}.{engine}.npz")


def _cache_versions() -> dict[str, str]:
    code = hashlib.sha256()
    for name in CODE_FILES:
        with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
            code.update(f.read())
    versions = {"format": str(CACHE_FORMAT), "code": code.hexdigest(), "olmo_data": __version__}
    for package in ("tokenizers", *ENGINES):  # not imported: that would cost start-up time
        versions[package] = installed_version(package)
    return versions


def installed_version(package: str) -> str:
    """The installed version of `package` (whose distribution has the same name), or "absent".

    Read from the `NAME-VERSION.dist-info` folder installers write beside the package (the wheel format's layout),
    and from `importlib.metadata` where that is not one unambiguous folder (an editable or egg install): importing
    `importlib.metadata` alone costs about 25 ms of every command's start-up.
    """
    import glob
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None:
        return "absent"
    where = list(spec.submodule_search_locations or [])[:1] or [spec.origin or ""]
    found = glob.glob(os.path.join(glob.escape(os.path.dirname(where[0])), f"{package}-*.dist-info"))
    if len(found) == 1:
        return os.path.basename(found[0])[len(package) + 1 : -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def save_checked(tok: Tokenizer, plan: Plan, tried_before: Sequence[str] = ()) -> None:
    """Store a self-checked plan (and the tokenizer's identity and special ids) for `load_checked`; `tried_before`:
    the engines `auto` tried first and found unusable (empty when the engine was asked for by name)."""
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
        "space_pairs": plan.space_pairs,
        "engine": tok.backend,
        "tried_before": list(tried_before),
    }
    path = _cache_file(tok.sha256, tok.backend)  # type: ignore[arg-type]
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


def load_checked(
    sha256: str, name: str, engine: Engine | None = None, num_threads: int = DEFAULT_NUM_THREADS
) -> Tokenizer | None:
    """The engine-backed tokenizer stored by `save_checked` for this file hash (named `name`), or None.

    `engine` None (auto): the entry of the engine `auto` would choose, the fastest installed one whose entry shows
    the faster ones were tried and found unusable; an engine's name: that engine's entry."""
    if engine is not None:
        entry = _load_entry(sha256, name, engine, num_threads)
        return None if entry is None else entry[0]
    installed = [e for e in ENGINES if available(e)]
    for i, candidate in enumerate(installed):
        entry = _load_entry(sha256, name, candidate, num_threads)
        if entry is not None and entry[1] == installed[:i]:
            return entry[0]
    return None


def _load_entry(sha256: str, name: str, engine: Engine, num_threads: int) -> tuple[Tokenizer, list[str]] | None:
    """The entry of `engine` and the engines tried before it; None when missing, stale or damaged."""
    import numpy as np

    path = _cache_file(sha256, engine)
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes())
            blob, lengths, ids = z["blob"].tobytes(), z["lengths"].tolist(), z["ids"].tolist()
        if meta.get("versions") != _cache_versions() or meta.get("sha256") != sha256 or meta["engine"] != engine:
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
            space_pairs=bool(meta["space_pairs"]),
        )
        encoder = TiktokenEncoder(engine, name, plan, num_threads)
        tried_before = [str(e) for e in meta["tried_before"]]
    except Exception as e:  # damaged, truncated or foreign: rebuild from the tokenizer.json
        log.debug("ignoring the tiktoken cache %s: %s", path, e)
        return None
    tok = Tokenizer(
        name=name,
        sha256=sha256,
        vocab_size=int(meta["vocab_size"]),
        backend=engine,
        eos_token_id=meta["eos_token_id"],
        bos_token_id=meta["bos_token_id"],
        pad_token_id=meta["pad_token_id"],
        hf=None,
        _encode_batch=encoder,
        _decode=encoder.decode,
    )
    return tok, tried_before
