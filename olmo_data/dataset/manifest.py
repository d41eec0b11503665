"""The manifest that says what a token directory holds.

`olmo-data tokenize` and `olmo-data prepare-tulu` write `DIR/manifest.json`; every later stage reads the dtype and
tokenizer from it rather than trusting a flag, and refuses a mismatch. Token files themselves stay headerless (the
format OLMo and `dolma tokens` use), so the manifest is a side file: files without one still load, given a dtype.

Schema (version 1), keys sorted on disk:
  format:        "olmo-data.tokens" | "olmo-data.chat"
  version:       1
  tool_version:  olmo_data.__version__
  dtype:         "uint16" | "uint32"
  tokenizer:     {name, path, sha256, vocab_size, backend}   path: absolute local path or hub id (newer manifests)
  eos_token_id, bos_token_id, pad_token_id:  int | null
  options:       the options that change the bytes of the output
  inputs:        [{path, size}]
  files:         [{path, metadata, documents, tokens, input}]   paths relative to the directory
  totals:        {documents, tokens, skipped_empty, skipped_bad, ...}
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from olmo_data.dataset.names import DTYPE_NAMES
from olmo_data.dataset.names import MANIFEST_NAME as MANIFEST_NAME  # re-exported: the names live in names.py
from olmo_data.dataset.names import MANIFEST_VERSION as MANIFEST_VERSION
from olmo_data.dataset.names import smallest_dtype as smallest_dtype
from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote, read_bytes

DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {"uint16": np.uint16, "uint32": np.uint32}
assert tuple(DTYPES) == DTYPE_NAMES  # one list of token dtypes


def read_manifest(directory: str) -> dict[str, Any] | None:
    """The manifest of a token directory (local or remote), or None when it has none."""
    path = f"{str(directory).rstrip('/')}/{MANIFEST_NAME}"
    if not is_remote(path) and not os.path.exists(path):
        return None
    try:
        manifest = json.loads(read_bytes(path))
    except DataError as e:
        if is_remote(path) and is_not_found_error(e):
            return None
        if is_remote(path):  # a network or permission failure is not "no manifest": that would guess the dtype
            detail = str(e).removeprefix(f"{path}: ")
            raise DataError(
                f"{path}: cannot read the token directory's manifest ({detail}); it decides the dtype of the "
                "token files, so check the network and credentials and retry"
            ) from e
        raise
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e}); the directory's manifest is damaged") from e
    if not isinstance(manifest, dict) or "dtype" not in manifest:
        raise DataError(f"{path}: not an olmo-data manifest (no 'dtype' key)")
    version = manifest.get("version", 0)
    if _is_int(version) and version > MANIFEST_VERSION:
        raise DataError(
            f"{path}: manifest version {manifest['version']} is newer than this tool understands "
            f"({MANIFEST_VERSION}); upgrade olmo-data"
        )
    problem = field_problem(manifest)
    if problem is not None:
        raise DataError(f"{path}: {problem}; the directory's manifest is damaged: re-run the command that wrote it")
    return dict(manifest)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any, least: int = 0) -> bool:
    return _is_int(value) and value >= least


def _optional_str(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value != "")


def _relative(value: Any) -> bool:
    """A file name inside the directory: a manifest never points elsewhere (`../x` or `/x` would read, and a
    resumed tokenize write, files that are not the directory's)."""
    return isinstance(value, str) and value != "" and not value.startswith("/") and ".." not in value.split("/")


def field_problem(manifest: dict[str, Any]) -> str | None:
    """The first manifest field of the wrong type or value, described by key; None when every field read is
    sound. Every later stage reads these fields as given (a dtype picks the reader, a count sizes a file), so a
    damaged one must stop here, by name, not as a KeyError or a misread file further on."""
    checks: list[tuple[str, Any, bool, str]] = [
        ("dtype", manifest["dtype"], manifest["dtype"] in DTYPES, f"one of {sorted(DTYPES)}"),
        ("version", manifest.get("version", 0), _count(manifest.get("version", 0)), "an integer"),
        ("format", manifest.get("format"), _optional_str(manifest.get("format")), "a string"),
    ]
    for key in ("sequence_length", "instance_length"):
        value = manifest.get(key)
        checks.append((key, value, value is None or _count(value, 1), "a positive integer"))
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = manifest.get(key)
        checks.append((key, value, value is None or _count(value), "a token id (0 or more) or null"))
    for key in ("tokenizer", "totals", "options"):
        value = manifest.get(key)
        checks.append((key, value, value is None or isinstance(value, dict), "a mapping"))
    files = manifest.get("files", [])
    checks.append(("files", files, isinstance(files, list), "a list of file entries"))
    for key, value, ok, expected in checks:
        if not ok:
            return f"{key} must be {expected}, got {shown(value)}"
    for k, entry in enumerate(files):
        where = f"files[{k}]"
        if not isinstance(entry, dict):
            return f"{where} must be a mapping, got {shown(entry)}"
        if not _relative(entry.get("path")):
            return f"{where}.path must be a file name inside the directory, got {shown(entry.get('path'))}"
        for key in ("tokens", "documents"):
            if entry.get(key) is not None and not _count(entry[key]):
                return f"{where}.{key} must be a count (0 or more), got {shown(entry[key])}"
        for key in ("metadata", "label_mask"):
            if entry.get(key) is not None and not _relative(entry[key]):
                return f"{where}.{key} must be a file name inside the directory, got {shown(entry[key])}"
    return None


NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404", "403", "AccessDenied"}


def is_not_found_error(error: BaseException) -> bool:
    """Whether a remote read failed because the file does not exist, looking through the exception chain.

    HTTP 404 and S3's NoSuchKey say so; HTTP 403 is taken as "missing" too, because S3 (and public buckets
    over HTTPS) answer 403 for a missing key when the caller may not list the bucket, and the two cannot be told
    apart. Anything else (connection refused, timeouts, 5xx) is a failure, not an absence.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, FileNotFoundError):
            return True
        response = getattr(current, "response", None)
        status = getattr(response, "status_code", None)  # requests.HTTPError
        if status in (403, 404):
            return True
        if isinstance(response, dict):  # botocore ClientError
            code = str(response.get("Error", {}).get("Code", ""))
            http = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in NOT_FOUND_CODES or http in (403, 404):
                return True
        if getattr(current, "code", None) in (403, 404):  # google.api_core NotFound / Forbidden
            return True
        current = current.__cause__ or current.__context__
    return False


def agreed_dtype(path: str, requested: str | None, recorded: str) -> str:
    """`recorded` (a manifest's dtype), after checking that a `requested` dtype, if any, agrees with it."""
    if requested is not None and requested != recorded:
        raise DataError(
            f"{path}: dtype {requested} was requested but the directory's manifest says {recorded}; "
            f"drop the dtype option or fix it to {recorded}"
        )
    return recorded


class Manifests:
    """Manifests by directory, each read once: a config may list thousands of files of one directory."""

    def __init__(self) -> None:
        self._cache: dict[str, dict[str, Any] | None] = {}

    def get(self, directory: str) -> dict[str, Any] | None:
        if directory not in self._cache:
            self._cache[directory] = read_manifest(directory)
        return self._cache[directory]

    def of_file(self, path: str) -> tuple[str, dict[str, Any]]:
        """The directory of token file `path`, and its manifest ({} when it has none)."""
        directory = path.rpartition("/")[0] or "."
        return directory, self.get(directory) or {}
