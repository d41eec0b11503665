"""The token files of an OLMo-core run whose dataset names a data mix (`dataset.mix`, as OLMo 3's official
scripts build every stage: `from_data_mix`).

A mix is a name OLMo-core resolves against lists shipped inside its own package and a `mix_base_dir`; this
package does not carry those lists. But OLMo-core's `ConfigSaverCallback` writes, beside every checkpoint's
`config.json`, `data_paths.txt`: the dataset's files one per line, in the dataset's order (after
`source_permutation_seed`, which is therefore not applied again). That file is what a saved run's batches were
cut from, so it is read; without it the mix is refused in one line naming what to do.
"""

from __future__ import annotations

import os
from typing import Any

from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote, read_bytes

DATA_PATHS = "data_paths.txt"  # OLMo-core's ConfigSaverCallback's default name


def mix_paths(dataset: dict[str, Any], where: str) -> tuple[str, ...]:
    """The files of `dataset.mix` from the `data_paths.txt` beside the config.json `where`, in dataset order."""
    mix = shown(dataset["mix"])
    if dataset.get("label_mask_paths"):
        raise DataError(f"{where}: dataset.mix {mix} with dataset.label_mask_paths; not covered")
    beside = (
        f"{where.rsplit('/', 1)[0]}/{DATA_PATHS}"
        if is_remote(where)
        else os.path.join(os.path.dirname(where), DATA_PATHS)
    )
    try:
        text = read_bytes(beside).decode("utf-8") if where != "config" else None
    except (OSError, DataError, UnicodeDecodeError):
        text = None
    if text is None:
        raise DataError(
            f"{where}: dataset.mix is OLMo-core's named data mix {mix}, whose files OLMo-core lists in the "
            f"{DATA_PATHS} it saves beside config.json; none found at {beside}: copy it there, or list the files in "
            f"dataset.paths in that order and remove dataset.source_permutation_seed (that file's order has it applied)"
        )
    paths = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not paths:
        raise DataError(f"{beside}: no token files listed (dataset.mix {mix}); expected one path per line")
    return paths
