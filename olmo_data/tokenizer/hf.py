"""The Hugging Face `tokenizers` backend: every tokenizer.json loads here, and it is the reference the tiktoken
backend is checked against."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from olmo_data.errors import DataError
from olmo_data.io import hub_offline_mode, hub_reachable
from olmo_data.tokenizer.base import BOS_CANDIDATES, EOS_CANDIDATES, PAD_CANDIDATES, Tokenizer

log = logging.getLogger(__name__)


def find_special(hf: Any, candidates: Sequence[str]) -> int | None:
    """The id of the first of `candidates` the vocabulary has: tokenizer.json files do not say which is EOS."""
    for tok in candidates:
        tid = hf.token_to_id(tok)
        if tid is not None:
            return int(tid)
    return None


def check_one_token_per_id(hf: Any, where: str) -> None:
    """Refuse a vocabulary that gives one id to two tokens. `tokenizers` loads it silently (and decodes the id as
    either token), while tiktoken panics on it from Rust, a traceback that names neither the file nor the id; a
    hand-edited or badly merged tokenizer.json is the usual cause."""
    vocab = hf.get_vocab(with_added_tokens=False)
    if len(set(vocab.values())) == len(vocab):
        return
    first: dict[int, str] = {}
    for token, tid in sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])):
        if tid in first:
            raise DataError(
                f"{where}: tokens {first[tid]!r} and {token!r} both have id {tid} in model.vocab; each id must "
                "name one token: fix the vocabulary (or use the tokenizer it was edited from)"
            )
        first[tid] = token


def ignored_settings(truncation: Any, padding: Any) -> list[str]:
    """The tokenizer.json settings every backend here leaves aside, worded for a warning: its `truncation` and
    `padding` (set by a `transformers` call that saved them). `tokenizers` applies them to every text it encodes, so a
    document would be cut at `max_length` and padded with the pad id: token files hold whole documents, unpadded."""
    found = []
    if truncation:
        found.append(f"truncation (max_length {truncation.get('max_length')})")
    if padding:
        found.append("padding")
    return found


def warn_ignored(where: str, ignored: Sequence[str]) -> None:
    if ignored:
        log.warning(
            "%s: the tokenizer.json sets %s; ignored: olmo-data encodes whole texts and pads nothing",
            where,
            " and ".join(ignored),
        )


def _whole_texts(hf: Any, where: str) -> None:
    """`hf` set to encode whole texts, unpadded (`ignored_settings`), with a warning where the file said otherwise."""
    ignored = ignored_settings(hf.truncation, hf.padding)
    if ignored:
        warn_ignored(where, ignored)
        hf.no_truncation()
        hf.no_padding()


def load_hf(spec: str) -> tuple[Any, str, str, str]:
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
        check_one_token_per_id(hf, spec)
        _whole_texts(hf, spec)
        return hf, os.path.basename(spec), hashlib.sha256(data).hexdigest(), text
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "tokenizer.json")):
        return load_hf(os.path.join(spec, "tokenizer.json"))
    if os.path.sep in spec and not spec.count("/") == 1 or spec.endswith(".json"):
        raise DataError(f"{spec}: tokenizer file not found")
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
    check_one_token_per_id(hf, spec)
    text = hf.to_str()
    _whole_texts(hf, spec)
    return hf, spec, hashlib.sha256(text.encode("utf-8")).hexdigest(), text


def load_hf_tokenizer(spec: str) -> tuple[Tokenizer, str]:
    """The `hf`-backed Tokenizer of `spec`, and the tokenizer.json it was loaded from (the tiktoken backend reads
    it again to build its equivalent, and serialising the HF tokenizer back would cost start-up time)."""
    hf, name, sha, json_text = load_hf(spec)
    tok = Tokenizer(
        name=name,
        sha256=sha,
        vocab_size=int(hf.get_vocab_size(with_added_tokens=True)),
        backend="hf",
        eos_token_id=find_special(hf, EOS_CANDIDATES),
        bos_token_id=find_special(hf, BOS_CANDIDATES),
        pad_token_id=find_special(hf, PAD_CANDIDATES),
        hf=hf,
    )
    return tok, json_text
