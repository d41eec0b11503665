"""The data a run trains on, and the arithmetic of its steps: token files and their manifests, mixtures, the
instance index (OLMo's cutting), the instance filter, data orders (OLMo's permutation, stored), steps and ranks,
batch fingerprints, which documents a span of tokens holds, source labels, and statistics.

Modules: `manifest` (a token directory's manifest.json), `token_files` (the files data paths name, sized and
checked), `mixture` (mix specs, `build_mix`), `instances` (`InstanceSource`, `open_dataset`, `open_from_config`),
`instance_filter` (OLMo's repetition rule), `order` (order files: built, stored, read, checked), `steps` (step,
epoch, batch and rank arithmetic; `run_steps`, the steps a run trains), `fingerprint` (batch fingerprints),
`doc_index` (documents of a token range, from the tokenize metadata), `sources` (source labels), `stats`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each module loads on first use (`__getattr__`)
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
        Manifests,
        is_not_found_error,
        read_manifest,
    )
    from olmo_data.dataset.mixture import build_mix, mix_report
    from olmo_data.dataset.names import DTYPE_NAMES, MANIFEST_NAME, MANIFEST_VERSION, smallest_dtype
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
    from olmo_data.dataset.order_checks import already_verified, remember_verified, search_order_file, verified_marker
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

# Each name's module. Loaded when first asked for, not when the package is imported: the package pulls in numpy
# and most of the data layer, ~0.15-0.25 s of every command's start-up (tokenize needs none of it: the manifest's
# names come from `names`, which imports nothing).
_WHERE = {
    "DocIndex": "doc_index",
    "DocumentSpan": "doc_index",
    "batch_fingerprint": "fingerprint",
    "Repetition": "instance_filter",
    "RepetitionFilter": "instance_filter",
    "instance_filter_of": "instance_filter",
    "LABEL_MASK_DTYPE": "instances",
    "InstanceSource": "instances",
    "dtype_note": "instances",
    "open_dataset": "instances",
    "open_from_config": "instances",
    "read_arrays": "instances",
    "DTYPES": "manifest",
    "DTYPE_NAMES": "names",
    "MANIFEST_NAME": "names",
    "MANIFEST_VERSION": "names",
    "Manifests": "manifest",
    "is_not_found_error": "manifest",
    "read_manifest": "manifest",
    "smallest_dtype": "names",
    "build_mix": "mixture",
    "mix_report": "mixture",
    "build_config_orders": "order",
    "build_order": "order",
    "check_order_entries": "order",
    "already_verified": "order_checks",
    "remember_verified": "order_checks",
    "search_order_file": "order_checks",
    "verified_marker": "order_checks",
    "default_order_location": "order",
    "ensure_order": "order",
    "first_difference": "order",
    "global_batch_indices": "order",
    "load_order": "order",
    "order_location": "order",
    "order_path_for_epoch": "order",
    "read_order_range": "order",
    "Sources": "sources",
    "DatasetStats": "stats",
    "FileStats": "stats",
    "SourceStats": "stats",
    "dataset_stats": "stats",
    "format_stats": "stats",
    "stats_for": "stats",
    "BatchPosition": "steps",
    "batch_position": "steps",
    "batches_per_epoch": "steps",
    "rank_positions": "steps",
    "rank_slice": "steps",
    "run_steps": "steps",
    "step_position": "steps",
    "TokenFile": "token_files",
}


def __getattr__(name: str) -> Any:
    """A name of the package (its module imported now, the name then kept here), or one of its modules."""
    module = _WHERE.get(name)
    if module is None:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DTYPE_NAMES",
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
    "already_verified",
    "remember_verified",
    "search_order_file",
    "verified_marker",
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
assert set(__all__) == set(_WHERE), "each name of the package's API needs its module in _WHERE"
