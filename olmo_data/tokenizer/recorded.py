"""The tokenizer the data was tokenized with, as its manifests record it (by sha256), to decode token files or to
encode text the way they were: another vocabulary prints plausible but wrong text, or finds nothing.

It decodes with `tokenizers` (as the data's readers always have) and encodes on the engine `tokenize` itself takes
(`load_tokenizer`'s auto: the fastest engine whose start-up self-check equals `tokenizers`), loaded on the first
encode, so that `trace --text`, `--spans` and `contamination` cost what tokenizing costs, and decoding alone nothing
more than before."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from olmo_data.errors import DataError
from olmo_data.tokenizer.base import Tokenizer
from olmo_data.tokenizer.load import load_tokenizer

if TYPE_CHECKING:
    from olmo_data.dataset import InstanceSource


def _recorded_tokenizer(source: InstanceSource) -> tuple[dict[str, Any], str] | None:
    """The tokenizer identity the token files' manifests record, and the manifest it came from; None without
    one. Files tokenized with different tokenizers cannot be decoded with one, so that is refused."""
    from olmo_data.dataset import read_manifest  # (here: the dataset package's import is most of a tokenize start-up)

    found: dict[str, tuple[dict[str, Any], str]] = {}
    for directory in dict.fromkeys(f.path.rpartition("/")[0] or "." for f in source.files):
        identity = ((read_manifest(directory) or {}).get("tokenizer")) or {}
        if identity.get("sha256"):
            found.setdefault(str(identity["sha256"]), (identity, f"{directory}/manifest.json"))
    if len(found) > 1:
        names = "; ".join(f"{m}: {i.get('name')!r} sha256 {sha[:16]}..." for sha, (i, m) in found.items())
        raise DataError(
            f"the token files were tokenized with different tokenizers ({names}); inspect them one source at a time"
        )
    return next(iter(found.values()), None)


def data_tokenizer(tokenizer: str | None, source: InstanceSource, purpose: str = "--decode") -> Tokenizer:
    """The tokenizer `source` was tokenized with, to decode it (or, for `trace --text`, to encode a passage the
    way the data was): another vocabulary prints plausible but wrong text, or finds nothing. The manifest's sha256
    is the judge. `purpose` names the option that needs it in the errors."""

    def load(spec: str) -> Tokenizer:
        if spec.endswith(".tiktoken"):
            return load_tokenizer(spec, "auto")
        tok = load_tokenizer(spec, "hf")
        tok._encode_batch = FastestEncoder(tok)
        return tok

    recorded = _recorded_tokenizer(source)
    identity, manifest = recorded if recorded is not None else ({}, "")
    expected = identity.get("sha256")
    if tokenizer is not None:
        tok = load(tokenizer)
        if expected and tok.sha256 != expected:
            raise DataError(
                f"--tokenizer {tokenizer} has sha256 {tok.sha256}, but {manifest} records that the data was "
                f"tokenized with {identity.get('name')!r} (sha256 {expected}); decoding with another tokenizer "
                "gives wrong text: pass --tokenizer with the tokenizer the data was tokenized with"
            )
        return tok
    if not identity:
        raise DataError(
            f"{purpose} needs the tokenizer: the token files have no manifest naming one; pass --tokenizer PATH "
            "(a tokenizer.json or .tiktoken file)"
        )
    name = identity.get("name")
    spec = identity.get("path") or (name if name and os.path.exists(str(name)) else None)
    if not spec:
        raise DataError(
            f"{purpose} needs the tokenizer: {manifest} names {name!r} but records no path to it, and no file of "
            "that name is here; pass --tokenizer PATH (a tokenizer.json or .tiktoken file)"
        )
    try:
        tok = load(str(spec))
    except DataError as e:
        raise DataError(
            f"{purpose} needs the tokenizer: {manifest} records {str(spec)!r}, which cannot be loaded here ({e}); "
            "pass --tokenizer PATH (a tokenizer.json or .tiktoken file)"
        ) from e
    if expected and tok.sha256 != expected:
        raise DataError(
            f"{purpose}: the tokenizer at {spec} has sha256 {tok.sha256}, but {manifest} records sha256 {expected} "
            f"for {name!r}: it is not the tokenizer the data was tokenized with (changed since?); pass "
            "--tokenizer PATH with the original tokenizer"
        )
    return tok


class FastestEncoder:
    """The batch encoder of an HF-backed `Tokenizer` that runs on the engine `load_tokenizer(path)` (auto) picks for
    the same file, loaded on the first call: an engine that passed the self-check, else `tokenizers` itself. The
    engine's tokenizer is used only when it is the same file (sha256)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.path, self.sha256, self.hf = tok.path, tok.sha256, tok.hf
        self.backend: str | None = None  # the backend that encodes, once loaded
        self._encode: Callable[[Sequence[str]], list[list[int]]] | None = None

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        if self._encode is None:
            fast = load_tokenizer(self.path, "auto") if self.path and os.path.isfile(self.path) else None
            if fast is not None and fast.sha256 == self.sha256 and fast.backend != "hf":
                self._encode, self.backend = fast.encode_batch, fast.backend
            else:
                self._encode, self.backend = self._hf, "hf"
        return self._encode(texts)

    def _hf(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch_fast(list(texts), add_special_tokens=False)]
