"""The data a run trains on, and the arithmetic of its steps: token files and their manifests, mixtures, the
instance index (OLMo's cutting), the instance filter, data orders (OLMo's permutation, stored), steps and ranks,
batch fingerprints, which documents a span of tokens holds, source labels, and statistics.

Modules: `manifest` (a token directory's manifest.json), `token_files` (the files data paths name, sized and
checked), `mixture` (mix specs, `build_mix`), `instances` (`InstanceSource`, `open_dataset`, `open_from_config`),
`instance_filter` (OLMo's repetition rule), `order` (order files: built, stored, read, checked), `steps` (step,
epoch, batch and rank arithmetic; `run_steps`, the steps a run trains), `fingerprint` (batch fingerprints),
`doc_index` (documents of a token range, from the tokenize metadata), `sources` (source labels), `stats`.
"""

from olmo_data.dataset.doc_index import DocIndex, DocumentSpan
from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.dataset.instance_filter import Repetition, RepetitionFilter, instance_filter_of
from olmo_data.dataset.instances import (
    LABEL_MASK_DTYPE,
    InstanceSource,
    dtype_note,
    open_dataset,
    open_from_config,
    read_arrays,
)
from olmo_data.dataset.manifest import (
    DTYPES,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    Manifests,
    is_not_found_error,
    read_manifest,
    smallest_dtype,
)
from olmo_data.dataset.mixture import build_mix, mix_report
from olmo_data.dataset.order import (
    build_config_orders,
    build_order,
    check_order_entries,
    default_order_location,
    ensure_order,
    first_difference,
    global_batch_indices,
    load_order,
    order_location,
    order_path_for_epoch,
    read_order_range,
)
from olmo_data.dataset.sources import Sources
from olmo_data.dataset.stats import DatasetStats, FileStats, SourceStats, dataset_stats, format_stats, stats_for
from olmo_data.dataset.steps import (
    BatchPosition,
    batch_position,
    batches_per_epoch,
    rank_positions,
    rank_slice,
    run_steps,
    step_position,
)
from olmo_data.dataset.token_files import TokenFile

__all__ = [
    "BatchPosition",
    "DTYPES",
    "DatasetStats",
    "DocIndex",
    "FileStats",
    "DocumentSpan",
    "InstanceSource",
    "LABEL_MASK_DTYPE",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifests",
    "Repetition",
    "RepetitionFilter",
    "SourceStats",
    "Sources",
    "TokenFile",
    "batch_fingerprint",
    "batch_position",
    "batches_per_epoch",
    "build_config_orders",
    "build_mix",
    "build_order",
    "dataset_stats",
    "default_order_location",
    "dtype_note",
    "ensure_order",
    "format_stats",
    "check_order_entries",
    "first_difference",
    "global_batch_indices",
    "instance_filter_of",
    "is_not_found_error",
    "load_order",
    "mix_report",
    "open_dataset",
    "open_from_config",
    "order_location",
    "order_path_for_epoch",
    "rank_positions",
    "rank_slice",
    "read_arrays",
    "read_manifest",
    "read_order_range",
    "run_steps",
    "smallest_dtype",
    "stats_for",
    "step_position",
]
