"""Token files as the instance index and mixtures see them: the files that data paths name, sized and checked.

A path in `data.paths` is a token file or a directory, and a directory is expanded through its manifest, which
also says each file's dtype, token count, label mask and document metadata. Every file is sized (the manifest's
count, checked against the file when local) before any instance is cut from it, so a truncated file or a wrong
dtype fails here with the file named, not later as garbage tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from olmo_data.dataset.manifest import DTYPES, Manifests, agreed_dtype
from olmo_data.errors import DataError
from olmo_data.io import file_size, file_sizes, is_remote


@dataclass(frozen=True)
class TokenFile:
    """One token file of the index: where it is, how to read it, and how many tokens it holds."""

    path: str
    dtype: str
    num_tokens: int
    label_mask_path: str | None = None
    metadata_path: str | None = None  # the tokenize metadata (.csv.gz) its manifest names, if any
    dtype_assumed: bool = False  # no manifest and no data.dtype said it: OLMo's default (uint16) was taken

    @property
    def itemsize(self) -> int:
        return int(np.dtype(DTYPES[self.dtype]).itemsize)


@dataclass
class _Entry:
    """A token file named by data.paths, before it is sized, with what its directory's manifest says of it."""

    path: str
    dtype: str
    tokens: int | None = None
    label_mask: str | None = None
    metadata: str | None = None
    instance_length: int | None = None  # a chat directory's instances are whole examples of this length
    dtype_assumed: bool = False


def entry_file_counts(paths: Sequence[str], dtype: str | None = None) -> list[int]:
    """How many token files each data.paths entry expands to (its files follow the previous entry's)."""
    manifests = Manifests()
    return [len(_expand_paths([p], dtype, manifests)) for p in paths]


def _expand_paths(paths: Sequence[str], dtype: str | None, manifests: Manifests | None = None) -> list[_Entry]:
    """Token files (with what their manifest says) for each path or directory of data.paths, in order."""
    out: list[_Entry] = []
    manifests = manifests if manifests is not None else Manifests()
    for raw in paths:
        path = str(raw)
        path = path if is_remote(path) else os.path.abspath(os.path.expanduser(path))
        is_dir = path.endswith("/") or (not is_remote(path) and os.path.isdir(path))
        maybe_dir = is_dir or (is_remote(path) and not path.endswith(".npy"))
        manifest = manifests.get(path.rstrip("/")) if maybe_dir else None
        if manifest is None and is_dir:
            raise DataError(
                f"{path}: a directory without manifest.json; list its token files in data.paths "
                "or re-run `olmo-data tokenize` to write one"
            )
        if manifest is not None:
            recorded = agreed_dtype(path, dtype, str(manifest["dtype"]))
            base = path.rstrip("/")
            length = manifest.get("sequence_length")
            for e in manifest.get("files", []):
                out.append(_entry(base, e, recorded))
                out[-1].instance_length = int(length) if length else None
            continue
        if not is_remote(path) and not os.path.exists(path):
            raise DataError(f"{path}: token file not found; check data.paths")
        directory, _, name = path.rpartition("/")
        manifest = manifests.get(directory or ".")
        listed = {e["path"]: e for e in (manifest or {}).get("files", [])}
        if manifest is None or (listed and name not in listed):
            out.append(_Entry(path, _plain_dtype(path, dtype), dtype_assumed=dtype is None))
            continue
        recorded = agreed_dtype(path, dtype, str(manifest["dtype"]))
        out.append(_entry(directory, listed[name], recorded) if name in listed else _Entry(path, recorded))
    return out


def _plain_dtype(path: str, dtype: str | None) -> str:
    """The dtype of a token file that no manifest describes: as requested, else OLMo's default uint16."""
    if dtype is not None and dtype not in DTYPES:
        raise DataError(f"{path}: unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    return dtype or "uint16"


def _entry(base: str, e: dict[str, Any], dtype: str) -> _Entry:
    tokens = e.get("tokens")
    return _Entry(
        f"{base}/{e['path']}",
        dtype,
        int(tokens) if tokens is not None else None,
        f"{base}/{e['label_mask']}" if e.get("label_mask") else None,
        f"{base}/{e['metadata']}" if e.get("metadata") else None,
    )


def token_file(path: str, dtype: str, tokens: int | None, mask: str | None, metadata: str | None = None) -> TokenFile:
    """Size a token file (the manifest's count, checked against the file when local) and its label mask."""
    itemsize = int(np.dtype(DTYPES[dtype]).itemsize)
    if tokens is None or not is_remote(path):
        try:
            size = file_size(path)
        except (OSError, DataError) as e:
            raise DataError(f"{path}: cannot read the token file's size ({e}); check data.paths") from e
        if size % itemsize:
            raise DataError(
                f"{path}: {size} bytes is not a whole number of {dtype} tokens; the file is truncated or its "
                "dtype is wrong (set data.dtype, or re-run tokenize)"
            )
        if tokens is not None and tokens != size // itemsize:
            raise DataError(
                f"{path}: the manifest says {tokens} tokens but the file holds {size // itemsize}; "
                "the directory changed after tokenizing; re-run tokenize"
            )
        tokens = size // itemsize
    if mask is not None:
        try:
            mask_size = file_size(mask)
        except (OSError, DataError) as e:
            raise DataError(f"{mask}: cannot read the label mask file ({e}); check data.label_mask_paths") from e
        if mask_size != tokens:
            raise DataError(
                f"{mask}: the label mask has {mask_size} entries but its token file {path} has {tokens} "
                "tokens; data.label_mask_paths must list one mask per token file, in the same order"
            )
    return TokenFile(path=path, dtype=dtype, num_tokens=int(tokens), label_mask_path=mask, metadata_path=metadata)


def token_files(
    paths: Sequence[str],
    label_mask_paths: Sequence[str] | None,
    dtype: str | None,
    sequence_length: int | None = None,
) -> list[TokenFile]:
    if isinstance(paths, str):
        paths = [paths]
    expanded = _expand_paths(paths, dtype)
    if not expanded:
        raise DataError("no token files: data.paths is empty (or its directories' manifests list no files)")
    for entry in expanded:
        if sequence_length is not None and entry.instance_length not in (None, sequence_length):
            raise DataError(
                f"{entry.path}: this chat data was prepared as instances of {entry.instance_length} tokens, but "
                f"the sequence length is {sequence_length}; set model.max_sequence_length to "
                f"{entry.instance_length}, or re-run prepare-tulu with --sequence-length {sequence_length}"
            )
    if label_mask_paths:
        masks = [str(m) for m in ([label_mask_paths] if isinstance(label_mask_paths, str) else label_mask_paths)]
        if len(masks) != len(expanded):
            raise DataError(
                f"data.label_mask_paths lists {len(masks)} files but data.paths expands to {len(expanded)} "
                "token files; give exactly one label mask per token file, in the same order"
            )
        for entry, m in zip(expanded, masks, strict=True):
            entry.label_mask = m if is_remote(m) else os.path.abspath(os.path.expanduser(m))

    def size(e: _Entry) -> TokenFile:
        found = token_file(e.path, e.dtype, e.tokens, e.label_mask, e.metadata)
        return dataclasses.replace(found, dtype_assumed=True) if e.dtype_assumed else found

    prefetch_sizes(expanded)
    return [size(e) for e in expanded]


def prefetch_sizes(expanded: Sequence[_Entry]) -> None:
    """Ask for the sizes of every remote token file and label mask that `token_file` will need at once
    (`file_sizes`: concurrently, once per process, cached on disk), so that sizing them in turn costs nothing.
    A failure here is left for `token_file` to report, naming the file and the key to check."""
    urls = [e.path for e in expanded if is_remote(e.path) and e.tokens is None]
    urls += [e.label_mask for e in expanded if e.label_mask and is_remote(e.label_mask)]
    if urls:
        with contextlib.suppress(DataError):
            file_sizes(urls)
