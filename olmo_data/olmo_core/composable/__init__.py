"""OLMo-core 3.0.0's composable data API (`olmo_core.data.composable`), rebuilt torch-free from a run's config.json.

A run on that API saves a `dataset` that is a list of instance-source configs and a `ComposableDataLoaderConfig`
(`spec` reads and checks them, refusing by class name what is not rebuilt here). Its sources are built as
OLMo-core builds them (`build`), one module per kind: numpy token files and their documents, concatenations
(`tokens`); concat-and-chunk instances (`instances`); slices and splits (`sliced`); sampling of tokens, documents
and instances (`sampling`); mixing to ratios (`mixing`); packed documents (`packing`); random instances
(`random_source`). `loader` gives the loader's sources per epoch, its shuffle strategies and steps; `data` opens
the run for `olmo_data.olmo_core.OlmoCoreData`, whose `batch(step, rank, world_size)` then gives its batches.

`spec` is part of this package's API as a module: `olmo_data.olmo_core.config` imports it (and only it) when it
meets such a run, because every other module here stands above `config`.
"""

from olmo_data.olmo_core.composable import spec
from olmo_data.olmo_core.composable.data import Composable, ComposableDataset, open_composable
from olmo_data.olmo_core.composable.loader import ComposableOrder, Loader, global_indices
from olmo_data.olmo_core.composable.spec import ComposableSpec, Node, is_composable, read_composable

__all__ = [
    "Composable",
    "ComposableDataset",
    "ComposableOrder",
    "ComposableSpec",
    "Loader",
    "Node",
    "global_indices",
    "is_composable",
    "open_composable",
    "read_composable",
    "spec",
]
