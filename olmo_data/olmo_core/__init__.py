"""OLMo-core's rules on the data side, in one place: its config.json, epochs, orders, datasets and mixtures.

OLMo-core (`ai2-olmo-core`, covered: 3.0.0) is the trainer behind OLMo 2 and AI2's later models. Its data loader
differs from OLMo's in ways that change every batch: epochs count from 1 (the first order is `PCG64(seed + 1)`),
the global batch size counts tokens, orders may shuffle chunks of instances, mixtures allocate token budgets and
read the first instances of each file, padded datasets make one instance per document, and a callback may change
the batch size during the run. This package reproduces those rules without importing torch or OLMo-core (which
only the tests use, as the reference), so that `inspect-batch`, `trace` and our trainer can rebuild exactly the
batch OLMo-core trained at any step, on any rank.
"""

from olmo_data.olmo_core.batches import (
    OlmoCoreBatch,
    OlmoCoreData,
    TrainedAt,
    olmo_core_batch,
    open_olmo_core,
)
from olmo_data.olmo_core.config import (
    BatchSizeChange,
    Mixture,
    MixtureSource,
    OlmoCoreRun,
    is_olmo_core_config,
    read_config_json,
    read_olmo_core_config,
)
from olmo_data.olmo_core.dataset import CoreInstance, OlmoCoreDataset, open_core_dataset
from olmo_data.olmo_core.mixture import MixtureFile, allocate_mixture
from olmo_data.olmo_core.order import (
    EpochOrder,
    build_olmo_core_order,
    olmo_core_order,
    order_file_name,
    write_olmo_core_order,
)
from olmo_data.olmo_core.packed import packed_documents
from olmo_data.olmo_core.runs import (
    data_fingerprint,
    instances_holding,
    olmo_core_of,
    open_trained_on,
    run_length,
    trained_at,
)
from olmo_data.olmo_core.steps import StepSlot, StepWalk
from olmo_data.olmo_core.summary import OlmoCoreStats, build_olmo_core_orders, format_olmo_core_stats, olmo_core_stats

__all__ = [
    "BatchSizeChange",
    "CoreInstance",
    "EpochOrder",
    "Mixture",
    "MixtureFile",
    "MixtureSource",
    "OlmoCoreBatch",
    "OlmoCoreData",
    "OlmoCoreDataset",
    "OlmoCoreRun",
    "OlmoCoreStats",
    "StepSlot",
    "StepWalk",
    "TrainedAt",
    "allocate_mixture",
    "build_olmo_core_order",
    "build_olmo_core_orders",
    "data_fingerprint",
    "instances_holding",
    "format_olmo_core_stats",
    "is_olmo_core_config",
    "olmo_core_batch",
    "olmo_core_of",
    "olmo_core_stats",
    "olmo_core_order",
    "open_core_dataset",
    "open_olmo_core",
    "open_trained_on",
    "order_file_name",
    "packed_documents",
    "read_config_json",
    "read_olmo_core_config",
    "run_length",
    "trained_at",
    "write_olmo_core_order",
]
