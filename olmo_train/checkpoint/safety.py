"""Reading a checkpoint someone else made without running its code or letting it name files elsewhere.

A sharded checkpoint's `.metadata` is a pickle, and `pickle.load` calls whatever the file names: a checkpoint
fetched from a URL or copied from shared storage could run a shell command in every rank before anything is
checked. Here it is read by an unpickler that builds only what DCP's metadata is made of (its dataclasses,
`torch.Size`, dtypes, paths) and refuses anything else by name, and the shard names it lists must be plain file
names inside the checkpoint directory. DCP's own reader and load planners are replaced by ones that use this
unpickler and `torch.load(weights_only=True)` (DCP's planners unpickle non-tensor entries, such as the optimizer's
hyperparameters, freely), so no path of the project unpickles a checkpoint file freely.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import pathlib
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.futures import Future

from olmo_data.errors import DataError


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object: every global that DCP metadata written by this project's trainer (1 and several
    ranks, FSDP and DDP, tied and untied, with optimizer state) refers to, plus the standard containers and paths
    another writer may use. Anything callable here only builds data."""
    from torch.distributed.checkpoint import metadata as md

    found: dict[tuple[str, str], Any] = {
        (md.__name__, name): getattr(md, name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    }
    found[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
    # OLMo-core's checkpoint writer pickles its own copy of the class (the same three fields): read as torch's
    found[("olmo_core.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
    found[("torch", "Size")] = torch.Size
    found[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    found[("collections", "OrderedDict")] = collections.OrderedDict
    # the checkpoint id is a path of the saving machine: informative only, so a Windows one stays a pure path
    found[("pathlib", "PosixPath")] = pathlib.PosixPath if pathlib.Path is pathlib.PosixPath else pathlib.PurePosixPath
    found[("pathlib", "WindowsPath")] = pathlib.PureWindowsPath
    found[("pathlib", "PurePosixPath")] = pathlib.PurePosixPath
    found[("pathlib", "PureWindowsPath")] = pathlib.PureWindowsPath
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            found[("torch", name)] = value
    return found


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata and nothing else: a global outside `_allowed_globals` is refused before it exists."""

    def __init__(self, file: io.BufferedIOBase, source: Path) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is None:
            raise DataError(
                f"{self.source}: refers to {module}.{name}, which checkpoint metadata is not made of; refused "
                "without loading it (a file crafted to run code when unpickled looks like this)"
            )
        return found


def read_metadata(path: Path) -> Metadata:
    """A DCP `.metadata` file, unpickled safely, its shard names checked to stay inside its directory."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()  # type: ignore[arg-type]
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(f"{path}: missing; the checkpoint is incomplete (copy it again)") from e
    except Exception as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise DataError(f"{path}: unreadable as checkpoint metadata ({reason}); copy it again") from e
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise DataError(f"{path}: holds a {type(metadata).__name__}, not the metadata of a sharded checkpoint")
    for info in metadata.storage_data.values():
        if not (
            isinstance(info, _StorageInfo)
            and isinstance(info.relative_path, str)
            and all(isinstance(n, int) and n >= 0 for n in (info.offset, info.length))
        ):
            raise DataError(f"{path}: a tensor's location is not a shard file name, offset and length: {info!r}")
    for name in sorted({info.relative_path for info in metadata.storage_data.values()}):  # few names, many entries
        shard_path(path, name)
    return metadata


def shard_path(metadata_file: Path, name: str) -> Path:
    """Where the shard `name`, as a checkpoint's metadata lists it, lies: a plain file name in the metadata's
    directory. A name with a separator or `..` (or a shard that is a link out of it) is refused: it could make a
    download write, or a load read, outside the checkpoint."""
    directory = metadata_file.parent
    if "/" not in name and _names_inside(directory, name):
        return directory / name
    raise DataError(f"{metadata_file}: shard name {name!r} is not a file name inside {directory}; refused")


def confined(directory: Path, name: str, source: Path | str) -> Path:
    """`directory / name` for a relative name read from `source` (a checksums.json entry such as `rng/rank0.pt`),
    refused by name if it is absolute, climbs out with `..`, or resolves (through links) outside `directory`."""
    if _names_inside(directory, name):
        return directory / name
    raise DataError(f"{source}: file name {name!r} is not a relative path inside {directory}; refused")


def _names_inside(directory: Path, name: str) -> bool:
    """`name` is a relative path of plain parts (no empty, `.` or `..` part, no backslash or NUL) that stays inside
    `directory` once links are resolved."""
    parts = name.split("/")
    plain = "\\" not in name and "\0" not in name and all(p not in ("", ".", "..") for p in parts)
    return plain and _inside(directory / name, directory)


def _inside(path: Path, directory: Path) -> bool:
    resolved, root = path.resolve(), directory.resolve()
    return resolved != root and resolved.is_relative_to(root)


def check_link(path: Path) -> None:
    """A checkpoint given as a link (`latest`, `latest-unsharded`) must point into the folder it is in, as the
    trainer's own links do: one that leads elsewhere is refused by name rather than followed."""
    if path.is_symlink() and not _inside(path, path.parent):
        raise DataError(f"{path}: a link to {path.resolve()}, outside {path.parent}; give that directory itself")


def storage_extents(metadata: Metadata) -> dict[str, int]:
    """Each shard file the metadata lists, with the size it must have at least to hold every piece in it."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def check_declared_sizes(metadata_file: Path, metadata: Metadata) -> None:
    """Every tensor piece the metadata declares must fit the bytes it says store it: a piece of 4 TB "stored" in
    4 MB would make a load allocate the 4 TB before reading anything (pieces written through a compressing
    storage extension are not bounded this way)."""
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        itemsize = torch.empty(0, dtype=entry.properties.dtype).element_size()
        for chunk in entry.chunks:
            info = metadata.storage_data.get(MetadataIndex(fqn, chunk.offsets))
            need = chunk.sizes.numel() * itemsize
            if info is not None and not getattr(info, "transform_descriptors", None) and info.length < need:
                raise DataError(
                    f"{metadata_file}: tensor {fqn} declares a piece of {list(chunk.sizes)} {entry.properties.dtype} "
                    f"({need} bytes) stored in {info.length} bytes; the metadata is damaged or forged (copy the "
                    "checkpoint again)"
                )


def check_shard_files(metadata_file: Path, metadata: Metadata) -> list[str]:
    """The shard file names, each checked to exist and to be long enough for every piece the metadata places in
    it; a missing or truncated shard is refused by name before any tensor is read."""
    directory = metadata_file.parent
    check_declared_sizes(metadata_file, metadata)
    needed = storage_extents(metadata)
    for name, size in sorted(needed.items()):
        shard = shard_path(metadata_file, name)
        if not shard.is_file():
            raise DataError(f"{directory}: shard file {name} is missing; the checkpoint is incomplete (copy it again)")
        if shard.stat().st_size < size:
            raise DataError(
                f"{directory}: shard file {name} is truncated ({shard.stat().st_size} bytes, the checkpoint's "
                f"metadata needs {size}); the checkpoint is incomplete (copy it again)"
            )
    return sorted(needed)


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with `.metadata` read by the restricted unpickler (tensors it already loads with
    `weights_only=True`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader does
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """DCP's reads, one shard file at a time, so that a shard whose bytes are not what DCP wrote (garbage of
        the right length in a checkpoint without checksums.json) is named in one line instead of torch's
        multi-line unpickling message (which even suggests loading it unsafely)."""
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except DataError:
                raise
            except Exception as e:
                shard = Path(str(self.path)) / name
                raise DataError(f"{shard}: not readable as a checkpoint shard ({_reason(e)}); copy it again") from e
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _reason(e: BaseException) -> str:
    """What went wrong reading damaged bytes, in a few words: torch's unpickling errors run to several lines of
    advice (to load the file with `weights_only=False`, which a damaged or crafted file must never be)."""
    if isinstance(e, pickle.UnpicklingError):
        return "its bytes are not tensors as torch.save writes them"
    first = str(e).strip().splitlines()[0].split(". ")[0].rstrip(".") if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:120]}" if first else type(e).__name__


def load_file(path: Path, what: str = "a checkpoint file") -> Any:
    """A file `torch.save` wrote (model.pt, optim.pt), loaded as plain data only; a damaged one (no checksums.json
    caught it) is named in one line, not in torch's multi-line unpickling message."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise DataError(f"{path}: missing; the checkpoint is incomplete (copy it again)") from e
    except Exception as e:
        raise DataError(f"{path}: not readable as {what} ({_reason(e)}); copy it again") from e


def _load_plain(planner: DefaultLoadPlanner, source: Path, read_item: ReadItem, value: io.BytesIO) -> None:
    """A non-tensor entry (an optimizer hyperparameter, a step count), loaded as plain data only."""
    fqn = read_item.dest_index.fqn
    try:
        obj = torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        reason = str(e).splitlines()[-1] if str(e) else type(e).__name__
        raise DataError(f"{source}: checkpoint entry {fqn} is not plain data; refused ({reason.strip()})") from e
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], obj)
    else:
        planner.state_dict[fqn] = obj


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor entries with `weights_only=True`."""

    def __init__(self, source: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, self.source, read_item, value)


class _SafeKeysLoadPlanner(_EmptyStateDictLoadPlanner):
    """Builds the state of the keys asked for from the metadata alone (no model needed), loading non-tensor
    entries with `weights_only=True`."""

    def __init__(self, source: Path, keys: set[str]) -> None:
        super().__init__(keys=keys)
        self.source = source

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, self.source, read_item, value)


def load_sharded(path: Path, state_dict: dict[str, Any]) -> None:
    """`dcp.load` of a checkpoint directory, in place, safely; a refusal comes out as the DataError it is, not
    wrapped in DCP's per-rank exception."""
    import torch.distributed.checkpoint as dcp

    with _unwrapped():
        dcp.load(state_dict, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(path))


def read_keys(path: Path, keys: set[str]) -> dict[str, Any]:
    """The entries `keys` of a sharded checkpoint, as plain CPU tensors, read in this process alone (no process
    group needed, none used if there is one)."""
    state: dict[str, Any] = {}
    planner: LoadPlanner = _SafeKeysLoadPlanner(path, keys)
    with _unwrapped():
        _load_state_dict(state, storage_reader=SafeFileSystemReader(str(path)), no_dist=True, planner=planner)
    return state


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """Re-raise a DataError that DCP wrapped in its CheckpointException (it collects failures per rank)."""
    try:
        yield
    except CheckpointException as e:
        for failure in e.failures.values():
            if isinstance(failure[0], DataError):
                raise failure[0] from None
        raise
