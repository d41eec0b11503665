"""OLMo-core's source mixtures: how many tokens each file gives, and which instances those are.

OLMo-core (`SourceMixtureDatasetConfig.build`) does not sample instances as `olmo-data mix` does. It:

1. counts each source's tokens (file size // item size) and asks `int(requested_tokens * target_ratio)` of it,
   refusing a source whose `available * max_source_fraction * max_repetition_ratio` falls short;
2. gives every file of a source `ceil(file_tokens * take_ratio)` tokens, `take_ratio` being asked / available;
   above 1 the source's file list is repeated, once per whole repetition and once for the fraction left;
3. rounds to whole instances so that the total is exactly `ceil(requested_tokens / global_batch_size)` batches:
   each file keeps `min(tokens // L, file_tokens // L)` instances, the missing ones are spread evenly over files
   with room, and what is still missing goes to the largest remainders (Hamilton's method);
4. drops files left with no tokens; the dataset's files are the rest, source after source, each occurrence
   reading the *first* `tokens // L` instances of its file (as a plain FSL file of that many tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from olmo_data.errors import DataError
from olmo_data.olmo_core.config import Mixture


@dataclass(frozen=True)
class MixtureFile:
    """One file occurrence of a mixture: `tokens` tokens from the start of `path`, for source `source`."""

    source: str
    path: str
    tokens: int


def allocate_mixture(
    mixture: Mixture, sequence_length: int, file_tokens: Callable[[str], int], *, where: str = "config"
) -> list[MixtureFile]:
    """The mixture's file occurrences in dataset order, with their token budgets (files with none dropped).

    `file_tokens(path)` gives a token file's length in tokens (OLMo-core counts them from the file size).
    """
    counts: dict[str, int] = {}

    def count(path: str) -> int:
        if path not in counts:
            counts[path] = int(file_tokens(path))
        return counts[path]

    planned: list[tuple[str, str, int, int]] = []  # (source, path, tokens wanted, tokens available)
    for source in mixture.sources:
        available = sum(count(p) for p in source.paths)
        needed = int(mixture.requested_tokens * source.target_ratio)
        cap = int((available * source.max_source_fraction) * source.max_repetition_ratio)
        if cap < needed:
            raise DataError(
                f"{where}: mixture source {source.name!r} has {available} tokens, at most {cap} usable, but "
                f"{needed} are asked for (OLMo-core refuses this run: insufficient tokens)"
            )
        if available == 0:
            raise DataError(f"{where}: mixture source {source.name!r} has no tokens")
        take_ratio = needed / available
        ratios = [take_ratio]
        if take_ratio > 1:
            ratios, remaining = [], take_ratio
            while remaining > 0:
                ratios.append(min(1.0, remaining))
                remaining -= min(1.0, remaining)
        for ratio in ratios:
            for path in source.paths:
                planned.append((source.name, path, int(math.ceil(count(path) * ratio)), count(path)))

    if mixture.global_batch_size % sequence_length:
        raise DataError(
            f"{where}: the mixture's global_batch_size ({mixture.global_batch_size}) is not a multiple of the "
            f"sequence length ({sequence_length})"
        )
    steps = math.ceil(mixture.requested_tokens / mixture.global_batch_size)
    wanted = steps * (mixture.global_batch_size // sequence_length)
    L = sequence_length
    limit = [avail // L for _, _, _, avail in planned]
    instances = [min(tokens // L, lim) for (_, _, tokens, _), lim in zip(planned, limit, strict=True)]
    remainders = [
        (tokens % L) / L if inst < lim else 0.0
        for (_, _, tokens, _), inst, lim in zip(planned, instances, limit, strict=True)
    ]
    missing = wanted - sum(instances)
    if missing > 0:
        eligible = [i for i in range(len(planned)) if instances[i] < limit[i]]
        if eligible:
            base = missing // len(eligible)
            if base:
                for i in eligible:
                    instances[i] += min(base, limit[i] - instances[i])
            missing = wanted - sum(instances)
            if missing > 0:
                candidates = sorted(((remainders[i], i) for i in eligible if instances[i] < limit[i]), reverse=True)
                for _, i in candidates[:missing]:
                    instances[i] += 1
    return [
        MixtureFile(source, path, n * L) for (source, path, _, _), n in zip(planned, instances, strict=True) if n > 0
    ]
