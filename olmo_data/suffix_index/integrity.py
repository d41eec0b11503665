"""What a shard's build records about its files, and the checks that hold a query to it.

A file of the same size but other bytes (zeroed, 0xFF, shuffled, a shard's copied onto another's, positions past
the token file's end) passes every size check and makes a query miss places or list impossible ones. So the build
records, in each shard's .json, a checksum of every block of its positions and of its keys (8-byte blake2b digests
of BLOCK-byte blocks, at most MAX_BLOCKS a file, and one checksum over them all), computed from the bytes it writes,
in the one pass that writes them. Then:

- a query (`sampled_check`, when it opens a shard) hashes the first, the last and a few random blocks of each file
  against the record, and checks a few random neighbouring suffixes of the shard: both positions inside the shard,
  the first sorting strictly before the second in the token file, and a few random keys equal to the first tokens
  of their suffixes. A few hundred KiB read a shard: a millisecond or two. Whole-file damage (zeroed, 0xFF,
  shuffled, swapped, out of range) fails it at every query; damage to one block is found by a query with the
  probability its blocks are drawn, and always by `olmo-data index` (`file_matches`) and `--verify` (`verify`).
- a rerun of `olmo-data index` hashes every positions and keys file whole against its record (4 bytes a token
  read) and rebuilds the shards that differ;
- `olmo-data index --verify` does all of it: every file hashed whole, every suffix checked in range and in order
  (sorted strictly: so the positions are the suffix array of the window), every key recomputed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.errors import DataError
from olmo_data.suffix_index.layout import shard_file
from olmo_data.suffix_index.search import PAST_END, SAMPLE_STEP, Samples

BLOCK = 1 << 16  # bytes a checksum covers (at least)
MAX_BLOCKS = 4096  # checksums a file (at most: a shard's record stays ~64 KiB of text)
DIGEST = 8  # bytes of each block's blake2b
HASHED_BLOCKS = 2  # random blocks a query hashes of each file (besides its first and last)
ORDER_PAIRS = 16  # random neighbouring suffixes a query checks a shard
KEY_SAMPLES = 8  # random keys a query recomputes a shard
COMPARE = 1 << 20  # tokens compared at once by the order check (all pairs together)
FIX = "rerun `olmo-data index CONFIG` (it rebuilds that shard), or trace with --no-index"


def block_size(nbytes: int) -> int:
    """Bytes a checksum covers in a file of `nbytes`: BLOCK, or the multiple of it that keeps MAX_BLOCKS."""
    blocks = -(-nbytes // BLOCK)
    return BLOCK * max(1, -(-blocks // MAX_BLOCKS))


def _sums(data: memoryview, block: int) -> bytes:
    return b"".join(
        hashlib.blake2b(data[a : a + block], digest_size=DIGEST).digest() for a in range(0, len(data), block)
    )


def file_record(data: np.ndarray) -> dict[str, Any]:
    """What a shard's record says of one of its files, from the array written to it: its size, block size, each
    block's checksum (hex) and one checksum over them."""
    raw = np.ascontiguousarray(data).data.cast("B")
    block = block_size(len(raw))
    sums = _sums(raw, block)
    return {"bytes": len(raw), "block": block, "sums": sums.hex(), "hash": hashlib.blake2b(sums).hexdigest()}


def _recorded(record: dict[str, Any], name: str, path: Path) -> tuple[int, int, bytes]:
    """(bytes, block, sums) of `record[name]`, or one line saying the record lacks them or contradicts itself."""
    try:
        entry = record[name]
        size, block, sums = int(entry["bytes"]), int(entry["block"]), bytes.fromhex(entry["sums"])
        whole = hashlib.blake2b(sums).hexdigest() == entry["hash"]
        if not whole or block != block_size(size) or len(sums) != DIGEST * -(-size // block):
            raise ValueError("its checksums disagree with each other")
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path}: its shard record holds no usable checksum of it ({e}); {FIX}") from e
    return size, block, sums


def _check_blocks(raw: np.ndarray, path: Path, recorded: tuple[int, int, bytes], blocks: np.ndarray) -> None:
    size, block, sums = recorded
    if len(raw) != size:
        raise DataError(f"{path}: {len(raw):,} bytes, its build wrote {size:,}; {FIX}")
    for b in blocks.tolist():
        got = hashlib.blake2b(raw[b * block : (b + 1) * block].data, digest_size=DIGEST).digest()
        if got != sums[b * DIGEST : (b + 1) * DIGEST]:
            end = min((b + 1) * block, size)
            raise DataError(
                f"{path}: bytes {b * block:,}-{end:,} differ from what its build wrote (block checksum); {FIX}"
            )


def file_matches(path: Path, record: dict[str, Any], name: str) -> bool:
    """Whether the whole file holds what the record says its build wrote (read in blocks, never whole)."""
    try:
        size, block, sums = _recorded(record, name, path)
        if path.stat().st_size != size:
            return False
        with open(path, "rb") as f:
            got = b"".join(
                hashlib.blake2b(f.read(block), digest_size=DIGEST).digest() for _ in range(-(-size // block))
            )
        return got == sums
    except (OSError, DataError):
        return False


def out_of_order(tokens: np.ndarray, limit: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Per pair: whether the suffix tokens[left : limit] fails to sort strictly before tokens[right : limit] (past
    `limit`, PAST_END sorts before every token). Tokens are compared in blocks that double for the pairs still
    equal, so the cost follows their common prefixes; only the pages they touch of a memory map are read."""
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    bad = left == right  # the same suffix twice: equal, never before itself
    lcp = np.zeros(len(left), dtype=np.int64)
    active = np.flatnonzero(~bad)
    width = 4
    while len(active):  # distinct suffixes differ in length: some token, or the end, tells them apart
        w = max(1, min(width, COMPARE // len(active)))
        offset = lcp[active, None] + np.arange(w)
        at_a, at_b = left[active, None] + offset, right[active, None] + offset
        a = tokens.take(at_a, mode="clip").astype(np.int64)
        b = tokens.take(at_b, mode="clip").astype(np.int64)
        a[at_a >= limit], b[at_b >= limit] = PAST_END, PAST_END
        differ = a != b
        first = np.argmax(differ, axis=1)
        k = np.flatnonzero(differ[np.arange(len(active)), first])
        bad[active[k]] = a[k, first[k]] > b[k, first[k]]
        active = np.delete(active, k)
        lcp[active] += w
        width *= 2
    return bad


def check_order(
    tokens: np.ndarray, start: int, window_end: int, positions: np.ndarray, ranks: np.ndarray, path: Path, source: str
) -> None:
    """Ranks r and r + 1 of a shard's positions: inside the shard, and sorted strictly by their suffixes in the
    token file `source` (`tokens`, the file or the shard's window: then `start` is 0); else one line naming the
    positions file and the ranks."""
    count = len(positions)
    ranks = np.asarray(ranks, dtype=np.int64)
    ranks = ranks[ranks < count - 1]
    here = np.asarray(positions[ranks]).astype(np.int64)
    after = np.asarray(positions[ranks + 1]).astype(np.int64)
    for r, p in ((ranks, here), (ranks + 1, after)):
        past = np.flatnonzero(p >= count)
        if len(past):
            raise DataError(
                f"{path}: rank {int(r[past[0]]):,} holds position {int(p[past[0]]):,}, past its shard's {count:,} "
                f"positions of {source}; {FIX}"
            )
    bad = np.flatnonzero(out_of_order(tokens, window_end, start + here, start + after))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{path}: the suffixes at ranks {int(ranks[i]):,} and {int(ranks[i]) + 1:,} (positions {int(here[i]):,} "
            f"and {int(after[i]):,}) are not in sorted order of {source}; {FIX}"
        )


def check_keys(
    tokens: np.ndarray, start: int, window_end: int, positions: np.ndarray, keys: np.ndarray, which: np.ndarray
) -> int:
    """The first key index of `which` whose key is not the first tokens of its sampled suffix; -1 when none."""
    which = np.asarray(which, dtype=np.int64)
    want = Samples.of(tokens, np.asarray(positions[which * SAMPLE_STEP]), start, window_end, step=1).keys
    differ = np.flatnonzero(np.asarray(keys[which]) != want)
    return int(which[differ[0]]) if len(differ) else -1


def sampled_check(
    tokens: np.ndarray,
    folder: Path,
    k: int,
    span: tuple[int, int, int],
    positions: np.ndarray,
    keys: np.ndarray,
    record: dict[str, Any],
    source: str,
    rng: np.random.Generator,
) -> None:
    """A query's check of shard k (its `span` start, end, window end) before answering from it: the first, last and
    a few random blocks of its positions and keys hashed against its record, a few random neighbouring suffixes in
    range and in order, a few random keys equal to their suffixes' first tokens. One line naming the file that
    disagrees; the draws are fresh each query, so damage missed once is found by a later one."""
    start, end, window_end = span
    data_path, keys_path = shard_file(folder, k, "u32"), shard_file(folder, k, "keys")
    for raw, path, name in ((positions, data_path, "positions"), (keys, keys_path, "keys")):
        recorded = _recorded(record, name, shard_file(folder, k, "json"))
        blocks = -(-recorded[0] // recorded[1])
        pick = np.unique(np.concatenate([[0, blocks - 1], rng.integers(0, blocks, HASHED_BLOCKS)]))
        _check_blocks(np.asarray(raw).view(np.uint8), path, recorded, pick)
    count = end - start
    ranks = np.unique(np.concatenate([[0, count - 2], rng.integers(0, max(count - 1, 1), ORDER_PAIRS)]))
    check_order(tokens, start, window_end, positions, ranks, data_path, source)
    which = np.unique(np.concatenate([[0, len(keys) - 1], rng.integers(0, len(keys), KEY_SAMPLES)]))
    bad = check_keys(tokens, start, window_end, positions, keys, which)
    if bad >= 0:
        raise DataError(
            f"{keys_path}: key {bad:,} is not the first {Samples.WIDTH} tokens of the suffix at rank "
            f"{bad * SAMPLE_STEP:,} of {data_path.name} in {source}; {FIX}"
        )
