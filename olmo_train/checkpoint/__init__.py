"""Checkpoints: saved atomically, checked before they are read, loaded on any number of ranks.

Modules: `layout` (every file name, the trainer state), `save`, `load`, `fetch` (a URL as a checked local copy),
`files` (a finished checkpoint read outside training; the checkpoint an import writes), `verify`, `lineage`
(where a checkpoint's weights came from), `soup` (the mean of checkpoints), `integrity`
(checksums.json), `safety` (nothing unpickled freely), `lock` (one writer per save folder), `space` (writes
refused for want of space or permission). The package knows nothing of adapters or of the training loop: a model
with more than plain weights brings its own `StateSplit` and `LoadHooks`.
"""

from olmo_train.checkpoint import integrity, lineage, safety, space
from olmo_train.checkpoint.fetch import localize
from olmo_train.checkpoint.files import (
    atomic_directory,
    checkpoint_kind,
    config_path,
    read_config,
    read_sharded,
    read_stored_model,
    recorded_tokenizer,
    refuse_existing,
    write_imported,
)
from olmo_train.checkpoint.integrity import read_trainer_state
from olmo_train.checkpoint.layout import (
    CHECKSUMS,
    CONFIG,
    DCP_METADATA,
    EXACT_FILE,
    INSTANCE_LOSS,
    LATEST,
    LATEST_UNSHARDED,
    METRICS,
    MODEL_FILE,
    OPTIM_FILE,
    RNG_DIR,
    TOKENIZER_FILE,
    TRAINER_STATE,
    WRITER_LOCK,
    TrainerState,
    is_unsharded,
    latest_checkpoint,
    list_checkpoints,
    metrics_aside,
    rng_file,
    step_dir,
)
from olmo_train.checkpoint.load import PLAIN, LoadHooks, agree_on_checkpoint, check_files, load_checkpoint
from olmo_train.checkpoint.lock import SaveFolderLock
from olmo_train.checkpoint.safety import check_link, read_metadata
from olmo_train.checkpoint.save import (
    PAUSE_AT_ENV,
    PAUSE_ENV,
    BackgroundSaves,
    StateSplit,
    plain_state,
    remove_stale_temporaries,
    rng_state,
    save_sharded,
    save_unsharded,
    set_rng_state,
)
from olmo_train.checkpoint.soup import average_checkpoints, parse_weights
from olmo_train.checkpoint.verify import lineage_lines, verify_checkpoint

__all__ = [
    "CHECKSUMS",
    "CONFIG",
    "DCP_METADATA",
    "EXACT_FILE",
    "LATEST",
    "LATEST_UNSHARDED",
    "INSTANCE_LOSS",
    "METRICS",
    "MODEL_FILE",
    "OPTIM_FILE",
    "PAUSE_AT_ENV",
    "PAUSE_ENV",
    "PLAIN",
    "RNG_DIR",
    "TOKENIZER_FILE",
    "TRAINER_STATE",
    "WRITER_LOCK",
    "BackgroundSaves",
    "LoadHooks",
    "SaveFolderLock",
    "StateSplit",
    "TrainerState",
    "agree_on_checkpoint",
    "atomic_directory",
    "average_checkpoints",
    "check_files",
    "check_link",
    "checkpoint_kind",
    "config_path",
    "integrity",
    "is_unsharded",
    "latest_checkpoint",
    "lineage",
    "lineage_lines",
    "list_checkpoints",
    "load_checkpoint",
    "localize",
    "metrics_aside",
    "parse_weights",
    "plain_state",
    "read_config",
    "read_metadata",
    "read_sharded",
    "read_stored_model",
    "read_trainer_state",
    "recorded_tokenizer",
    "refuse_existing",
    "remove_stale_temporaries",
    "rng_file",
    "rng_state",
    "safety",
    "space",
    "save_sharded",
    "save_unsharded",
    "set_rng_state",
    "step_dir",
    "verify_checkpoint",
    "write_imported",
]
