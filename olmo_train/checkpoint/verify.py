"""`olmo-train verify`: a checkpoint checked file by file without loading a model.

What a load would refuse, found before a run (or a copy to other storage) relies on the checkpoint: a file that
differs from its checksums.json record, a sharded checkpoint whose metadata names a missing or short shard or a
tensor stored nowhere, and any `torch.save` file that would need more than plain data to load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_train.checkpoint import integrity, lineage, safety
from olmo_train.checkpoint.fetch import localize
from olmo_train.checkpoint.files import checkpoint_kind
from olmo_train.checkpoint.layout import CHECKSUMS, DCP_METADATA, RNG_DIR
from olmo_train.checkpoint.load import check_files
from olmo_train.distributed import Dist


def verify_checkpoint(spec: str, *, strict: bool = False) -> str:
    """Check a checkpoint (a directory or a URL, downloaded as a load would) without loading a model, and return
    a one-line summary; any problem is a DataError naming the file. Checked: every file against checksums.json
    (its absence is a warning, or with `strict` an error), a sharded checkpoint's metadata read safely, its shard
    names inside the directory and every tensor it lists wholly inside an existing shard, and that every
    `torch.save` file loads as plain data (a static look at its pickle: no tensor is read)."""
    path = localize(spec, Dist(0, 1, 0, torch.device("cpu"))) if is_remote(spec) else Path(spec).expanduser()
    kind = checkpoint_kind(path)
    records = integrity.read_checksums(path)
    if strict and records is None:
        raise DataError(f"{path}: no {CHECKSUMS}, so its files cannot be checked (--strict)")
    shards = check_files(path)
    tensors = 0
    if kind == "sharded":
        tensors = _check_tensors_stored(path / DCP_METADATA)
    for pt in sorted(path.glob("*.pt")) + sorted(path.glob(f"{RNG_DIR}/*.pt")):
        _check_plain(pt)
    state = integrity.read_trainer_state(path)
    if records is None:
        checked = f"not checked: no {CHECKSUMS} (saved before checksums existed)"
    else:
        size = sum(r["size"] for r in records.values())
        checked = f"{len(records)} files ({size / 1e6:.1f} MB) match {CHECKSUMS}"
    stored = f"; metadata safe, {tensors} tensors inside {len(shards)} shard files" if kind == "sharded" else ""
    return f"{path}: {kind} checkpoint of step {state.step}: {checked}{stored}"


def _check_tensors_stored(metadata_file: Path) -> int:
    """Every tensor the metadata lists has each of its chunks stored (offset and length inside a shard file,
    which `check_files` established), and its chunks cover it; returns the number of tensors."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    metadata = safety.read_metadata(metadata_file)
    tensors = 0
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            if MetadataIndex(fqn) not in metadata.storage_data:
                raise DataError(f"{metadata_file}: entry {fqn} is listed but stored in no shard file")
            continue
        tensors += 1
        for chunk in entry.chunks:
            if MetadataIndex(fqn, chunk.offsets) not in metadata.storage_data:
                raise DataError(f"{metadata_file}: tensor {fqn} has a piece at {list(chunk.offsets)} in no shard file")
        if sum(chunk.sizes.numel() for chunk in entry.chunks) != entry.size.numel():
            raise DataError(f"{metadata_file}: the stored pieces of tensor {fqn} do not make up its {list(entry.size)}")
    return tensors


def _check_plain(path: Path) -> None:
    """A `torch.save` file must load with weights_only=True: its pickle is read statically for the globals it
    names (an RNG file saved before the state was kept in tensors may name numpy's array classes)."""
    allowed = {"numpy.ndarray", "numpy.dtype", "numpy._core.multiarray._reconstruct", "numpy.dtypes.UInt32DType"}
    try:
        unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception as e:
        raise DataError(f"{path}: not a file torch.save wrote ({type(e).__name__}: {e})") from e
    if path.parent.name == RNG_DIR:
        unsafe -= allowed
    if unsafe:
        names = ", ".join(sorted(unsafe))
        raise DataError(f"{path}: refers to {names}, which plain tensors and values do not; refused")


def lineage_lines(spec: str) -> list[str]:
    """The checkpoint's lineage (each parent stage, its step and tokens) and the tokens of all stages in total,
    as lines to print (`olmo-train verify --lineage`)."""
    path = localize(spec, Dist(0, 1, 0, torch.device("cpu"))) if is_remote(spec) else Path(spec).expanduser()
    return lineage.describe(integrity.read_trainer_state(path))
