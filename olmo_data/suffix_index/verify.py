"""`olmo-data index --verify`: the whole check of a run's suffix index, where a query checks only samples
(`integrity`). Read-only: it says what it checked, or refuses at the first file that disagrees, by name.

Per shard: its window of the token file hashed against the window checksum its build recorded (the windows cover
every token, so the token files are checked whole); its positions and keys hashed whole against their block
checksums; every position inside the shard and every pair of neighbouring suffixes in strictly increasing order
(together: the positions are exactly the window's suffix array); every key recomputed from its suffix. Memory: one
shard's window at a time (2-4 bytes a token of a shard) and blocks of COMPARE pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from olmo_data.dataset import InstanceSource
from olmo_data.display import bar_disabled
from olmo_data.errors import DataError
from olmo_data.suffix_index.integrity import FIX, check_keys, check_order, file_matches
from olmo_data.suffix_index.layout import read_json_capped, shard_file
from olmo_data.suffix_index.parts import window_hash
from olmo_data.suffix_index.query import FileSuffixIndex, Shard, open_index

PAIRS = 1 << 20  # neighbouring suffixes checked at once


@dataclass
class VerifySummary:
    files: int
    tokens: int
    shards: int
    token_bytes: int  # of the token files, hashed
    index_bytes: int  # of positions and keys, hashed
    seconds: float


def verify_index(source: InstanceSource, index_dir: str | None = None, progress: bool | None = None) -> VerifySummary:
    """Check every file of the run's index whole against what its build recorded; one line naming the first that
    disagrees (DataError), else what was checked."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    index = open_index(source, index_dir)  # the query's checks first: manifests, stamps, ranges, sizes, samples
    if index is None:
        raise DataError("the run's token files have no suffix index; run `olmo-data index CONFIG` first")
    token_bytes = index_bytes = shards = 0
    bar = tqdm(total=index.tokens, unit=" tokens", unit_scale=True, desc="verify", disable=bar_disabled(progress))
    with bar:
        for path, file_index in index.files.items():
            for k, shard in enumerate(file_index.shards):
                token_bytes += _verify_shard(file_index, k, shard, path, bar.update)
                index_bytes += shard.positions.nbytes + shard.samples.keys.nbytes
                shards += 1
    return VerifySummary(len(index.files), index.tokens, shards, token_bytes, index_bytes, time.perf_counter() - t0)


def _verify_shard(file_index: FileSuffixIndex, k: int, shard: Shard, path: str, done: Callable[[int], object]) -> int:
    """Shard k whole: its window, positions and keys checksums, every suffix's range and order, every key. Returns
    the bytes of the token file it read."""
    folder = file_index.folder
    data_path, keys_path = shard_file(folder, k, "u32"), shard_file(folder, k, "keys")
    record = read_json_capped(shard_file(folder, k, "json"))
    window = np.array(file_index.tokens[shard.start : shard.window_end])
    if window_hash(window, 0, len(window)) != record["window_hash"]:
        raise DataError(
            f"{path}: tokens {shard.start:,}-{shard.window_end:,} differ from those {data_path.name} was sorted by "
            "(window checksum); rerun `olmo-data index CONFIG` (it sorts the shards that changed)"
        )
    for file, name in ((data_path, "positions"), (keys_path, "keys")):
        if not file_matches(file, record, name):
            raise DataError(f"{file}: differs from what its build wrote (its block checksums); {FIX}")
    count = shard.end - shard.start
    for a in range(0, max(count - 1, 0), PAIRS):
        ranks = np.arange(a, min(a + PAIRS, count - 1))
        check_order(window, 0, len(window), shard.positions, ranks, data_path, path)
        done(len(ranks))
    if count == 1 and int(shard.positions[0]) != 0:  # no neighbours to check it by: its one position is 0
        raise DataError(f"{data_path}: its one position is {int(shard.positions[0])}, not 0; {FIX}")
    keys = shard.samples.keys
    for a in range(0, len(keys), PAIRS):
        bad = check_keys(window, 0, len(window), shard.positions, keys, np.arange(a, min(a + PAIRS, len(keys))))
        if bad >= 0:
            raise DataError(f"{keys_path}: key {bad:,} is not the first tokens of its suffix in {path}; {FIX}")
    done(1)
    return int(window.nbytes)
