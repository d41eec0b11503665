"""A cache of checked engine plans.

Building the plan from a large tokenizer.json and loading the HF tokenizer for the self-check take most of a
second (cl100k); both are deterministic given the file's bytes and the library versions, so once a plan has passed
the self-check on an engine it is stored under the file's SHA-256 and the engine's name, and later loads skip
both. An entry also records the engines `auto` tried first and found unusable, so that `auto` takes an entry only
when it would have chosen that engine itself (versions of every engine installed are part of the key: installing
riptoken invalidates the entries made without it).

An entry is one file read at every start-up, so it is laid out for loading: a JSON line (the plan's settings, the
sizes and SHA-256 of what follows), then the ranks' tokens back to back, their `struct` format (`3s5s2s...`, one
item a token, so that one `struct.unpack` call in C cuts them apart) and their ids as little-endian uint32. No
pickle, no numpy (its import alone is a noticeable part of a tokenize start-up); a damaged, truncated or foreign
file fails its checks and is ignored.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import struct
import sys
from collections.abc import Sequence
from typing import Any

from olmo_data import __version__
from olmo_data.io import atomic_path, default_cache_dir
from olmo_data.tokenizer.base import Tokenizer
from olmo_data.tokenizer.engines import DISTRIBUTIONS, ENGINES, Engine, available
from olmo_data.tokenizer.fastokens_engine import FastokensEncoder
from olmo_data.tokenizer.hf import warn_ignored
from olmo_data.tokenizer.tiktoken_encoder import DEFAULT_NUM_THREADS, TiktokenEncoder
from olmo_data.tokenizer.tiktoken_plan import Plan

log = logging.getLogger(__name__)

CACHE_FORMAT = 4
MAGIC = b"olmo-data checked plan\n"  # the first line of an entry
# The code that builds, checks and runs a plan: a change to any of it invalidates every cached plan.
CODE_FILES = (
    "tiktoken_plan.py",
    "tiktoken_encoder.py",
    "tiktoken_backend.py",
    "tiktoken_cache.py",
    "engines.py",
    "quicktok_engine.py",
    "fastokens_engine.py",
)


def _cache_file(sha256: str, engine: Engine) -> str:
    return os.path.join(default_cache_dir(), "tiktoken", f"{sha256}.{engine}.plan")


def _cache_versions() -> dict[str, str]:
    code = hashlib.sha256()
    for name in CODE_FILES:
        with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
            code.update(f.read())
    versions = {"format": str(CACHE_FORMAT), "code": code.hexdigest(), "olmo_data": __version__}
    for package in ("tokenizers", *ENGINES):  # not imported: that would cost start-up time
        versions[package] = installed_version(package, DISTRIBUTIONS.get(package))
    return versions


def installed_version(package: str, distribution: str | None = None) -> str:
    """The installed version of `package` (from `distribution`, by default the package's name), or "absent".

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
    dist = distribution or package
    found = glob.glob(os.path.join(glob.escape(os.path.dirname(where[0])), f"{dist}-*.dist-info"))
    if len(found) == 1:
        return os.path.basename(found[0])[len(dist) + 1 : -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def save_checked(tok: Tokenizer, plan: Plan, tried_before: Sequence[str] = (), ignored: Sequence[str] = ()) -> None:
    """Store a self-checked plan (and the tokenizer's identity and special ids) for `load_checked`; `tried_before`:
    the engines `auto` tried first and found unusable (empty when the engine was asked for by name); `ignored`: the
    file's settings left aside (`hf.ignored_settings`), warned of again at each load of the entry."""
    if tok.backend == "fastokens":  # loaded from the tokenizer.json itself: the entry only says it passed
        parts = [b"", b"", b""]
    else:
        tokens = sorted(plan.ranks, key=plan.ranks.__getitem__)
        ids = _little_endian(array.array("I", [plan.ranks[t] for t in tokens]))
        parts = [b"".join(tokens), "".join(f"{len(t)}s" for t in tokens).encode(), ids.tobytes()]
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
        "ignored": list(ignored),
        "sizes": [len(p) for p in parts],  # tokens, their format, ids
        "payload_sha256": hashlib.sha256(b"".join(parts)).hexdigest(),
    }
    path = _cache_file(tok.sha256, tok.backend)  # type: ignore[arg-type]
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(MAGIC + json.dumps(meta).encode() + b"\n")
            for part in parts:
                f.write(part)
        old = path[: -len(".plan")] + ".npz"  # the entry of format 2, never read again
        if os.path.exists(old):
            os.remove(old)
    except OSError as e:  # a read-only home or a full disk only costs speed
        log.debug("could not cache the tiktoken plan at %s: %s", path, e)


def _little_endian(ids: array.array[int]) -> array.array[int]:
    """`ids` (uint32) in little-endian order, as entries store them, whatever this machine's order (in place)."""
    assert ids.itemsize == 4, "entries store ids as 4-byte unsigned ints"
    if sys.byteorder == "big":
        ids.byteswap()
    return ids


def load_checked(
    sha256: str,
    name: str,
    engine: Engine | None = None,
    num_threads: int = DEFAULT_NUM_THREADS,
    json_bytes: bytes | None = None,
) -> Tokenizer | None:
    """The engine-backed tokenizer stored by `save_checked` for this file hash (named `name`), or None.

    `engine` None (auto): the entry of the engine `auto` would choose, the fastest installed one whose entry shows
    the faster ones were tried and found unusable; an engine's name: that engine's entry. `json_bytes`: the
    tokenizer.json's bytes (whose SHA-256 is `sha256`), which fastokens loads from (its entry holds no plan)."""
    if engine is not None:
        entry = _load_entry(sha256, name, engine, num_threads, json_bytes)
        return None if entry is None else entry[0]
    installed = [e for e in ENGINES if available(e)]
    for i, candidate in enumerate(installed):
        entry = _load_entry(sha256, name, candidate, num_threads, json_bytes)
        if entry is not None and entry[1] == installed[:i]:
            return entry[0]
    return None


def _load_entry(
    sha256: str, name: str, engine: Engine, num_threads: int, json_bytes: bytes | None
) -> tuple[Tokenizer, list[str]] | None:
    """The entry of `engine` and the engines tried before it; None when missing, stale or damaged."""
    if engine == "fastokens" and json_bytes is None:
        return None
    path = _cache_file(sha256, engine)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:  # missing (the usual case: not cached yet), or unreadable
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not an entry of this format")
        end = data.index(b"\n", len(MAGIC))
        meta = json.loads(data[len(MAGIC) : end])
        if meta.get("versions") != _cache_versions() or meta.get("sha256") != sha256 or meta["engine"] != engine:
            return None
        payload = memoryview(data)[end + 1 :]
        n_tokens, n_format, n_ids = (int(n) for n in meta["sizes"])
        if len(payload) != n_tokens + n_format + n_ids:
            raise ValueError(f"truncated: {len(payload)} bytes after the header, not {n_tokens + n_format + n_ids}")
        if hashlib.sha256(payload).hexdigest() != meta["payload_sha256"]:
            raise ValueError("damaged: its bytes do not match their SHA-256")
        tried_before = [str(e) for e in meta["tried_before"]]
        warn_ignored(name, [str(s) for s in meta.get("ignored", [])])
        if engine == "fastokens":
            assert json_bytes is not None
            # (loads on a thread of its own: the caller's next work runs beside it)
            text = json_bytes.decode("utf-8")
            encoder: TiktokenEncoder | FastokensEncoder = FastokensEncoder(name, text, num_threads)
            return _checked_tokenizer(name, sha256, engine, meta, encoder), tried_before
        tokens = struct.unpack(bytes(payload[n_tokens : n_tokens + n_format]), payload[:n_tokens])
        ids = array.array("I")
        ids.frombytes(payload[n_tokens + n_format :])
        ranks = dict(zip(tokens, _little_endian(ids).tolist(), strict=True))
        plan = Plan(
            pat_str=meta["pat_str"],
            ranks=ranks,
            nfc=bool(meta["nfc"]),
            raw_tokens={k: int(v) for k, v in meta["raw_tokens"].items()},
            normalized_tokens={k: int(v) for k, v in meta["normalized_tokens"].items()},
            space_pairs=bool(meta["space_pairs"]),
        )
        encoder = TiktokenEncoder(engine, name, plan, num_threads)
        return _checked_tokenizer(name, sha256, engine, meta, encoder), tried_before
    except Exception as e:  # damaged, truncated or foreign: rebuild from the tokenizer.json
        log.debug("ignoring the tiktoken cache %s: %s", path, e)
        return None


def _checked_tokenizer(
    name: str, sha256: str, engine: Engine, meta: dict[str, Any], encoder: TiktokenEncoder | FastokensEncoder
) -> Tokenizer:
    return Tokenizer(
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
