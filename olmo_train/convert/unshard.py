"""A sharded checkpoint made into an unsharded one, in one plain CPU process.

A sharded checkpoint (`stepN/`) needs `torch.distributed.checkpoint` and its metadata to be read, while an
unsharded one (`model.pt`, `optim.pt`) is two `torch.load`s: what other tools, a laptop, or a run on another
kind of machine expect. DCP's metadata records every tensor's global shape and where each of its pieces lies, so
the pieces are assembled here without a process group and without knowing the world size that saved them.

The result is, file for file, what the trainer's `save_unsharded` writes at that step, so it resumes a run (or,
with `model_only`, seeds a fresh one with `--reset_trainer_state`) exactly as the trainer's own would. Memory
stays near one copy of the largest part: the model is read, written and freed before the optimizer state (about
twice the model's size with AdamW) is read. Nothing appears under the destination's name until it is complete.
The source's files are checked against its checksums.json before anything is written, and the result has its
own checksums.json, recorded as it is written.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from olmo_data.display import progress_bar
from olmo_data.errors import DataError
from olmo_train.checkpoint import (
    CONFIG,
    DCP_METADATA,
    EXACT_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    RNG_DIR,
    TRAINER_STATE,
    atomic_directory,
    check_files,
    check_link,
    checkpoint_kind,
    config_path,
    read_metadata,
    read_sharded,
    refuse_existing,
    rng_file,
)
from olmo_train.checkpoint.integrity import Recorder
from olmo_train.nn.lora import split_state

log = logging.getLogger(__name__)


def unshard(checkpoint: Path, destination: Path | None = None, *, model_only: bool = False) -> Path:
    """Write the unsharded form of the sharded `checkpoint` to `destination` (default: `stepN-unsharded` beside
    it) and return its path. With `model_only` the optimizer state is left out: enough for export, generation
    and fine-tuning, not for continuing the run; its default name is then `stepN-model`, which the trainer does
    not take for a checkpoint to resume from."""
    # `latest` is a link (into its own folder): resolved, the default destination is stepN-unsharded, not the
    # latest-unsharded link
    check_link(Path(checkpoint).expanduser())
    source = Path(checkpoint).expanduser().resolve()
    if checkpoint_kind(source) == "unsharded":
        raise DataError(f"{checkpoint}: already unsharded (it holds {MODEL_FILE}); use it as it is")
    suffix = "-model" if model_only else "-unsharded"
    dest = Path(destination).expanduser() if destination is not None else source.parent / f"{source.name}{suffix}"
    refuse_existing(dest)
    check_files(source)  # refuse a damaged, crafted, missing or truncated file before writing anything
    metadata = read_metadata(source / DCP_METADATA)
    config = _config_or_none(source)

    parts = ["model"] if model_only else ["model", "optim"]
    total = 2 * sum(_part_bytes(metadata, key) for key in parts)  # each byte read, then written
    with atomic_directory(dest) as tmp, progress_bar(desc="unshard", total=total, unit="B", delay=1.0) as bar:
        (tmp / RNG_DIR).mkdir()
        written = Recorder(tmp)
        _write_part(source, "model", written, MODEL_FILE, metadata, exact=not model_only, bar=bar)
        if not model_only:
            _write_part(source, "optim", written, OPTIM_FILE, metadata, bar=bar)
        if (source / rng_file(0)).is_file():
            written.copy(source / rng_file(0), rng_file(0))
        if config is not None:
            written.copy(config, CONFIG)
        # checksums.json, then trainer_state.json: the last file, it marks the checkpoint complete
        written.finish(TRAINER_STATE, (source / TRAINER_STATE).read_bytes())
    return dest


def _config_or_none(path: Path) -> Path | None:
    """The run's config travels with the checkpoint; its absence does not stop the weights from being useful."""
    try:
        return config_path(path)
    except DataError as e:
        log.warning("%s; the unsharded checkpoint will have no %s", e, CONFIG)
        return None


def _part_bytes(metadata: Metadata, key: str) -> int:
    """The bytes of one part's tensors ("model" or "optim"), as the metadata lists them."""
    return sum(
        m.size.numel() * m.properties.dtype.itemsize
        for k, m in metadata.state_dict_metadata.items()
        if k.startswith(f"{key}.") and isinstance(m, TensorStorageMetadata)
    )


def _write_part(
    source: Path, key: str, written: Recorder, name: str, metadata: Metadata, *, exact: bool = False, bar: Any
) -> None:
    """Write one part; the model of a ReLoRA run as the trainer writes it: merged weights, and (`exact`) the
    unmerged adapted linears in relora.pt for a resume. `bar` (bytes) moves once it is read and once written."""
    size = _part_bytes(metadata, key)
    bar.set_postfix_str(f"reading {key}")
    t0 = time.perf_counter()
    state = read_sharded(source, key)
    bar.update(size)
    bar.set_postfix_str(f"writing {name}")
    if key == "model":
        state, adapted = split_state(state)
        if adapted and exact:
            written.torch_save(adapted, EXACT_FILE)
    written.torch_save(state, name)
    del state  # freed before the next part is read
    bar.update(size)
    log.debug("%s done in %.1f s", name, time.perf_counter() - t0)
