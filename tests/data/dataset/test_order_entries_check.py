"""The check every order file read gets (`check_order_entries`): no entry past the data, none twice, the first
repeat named by its position. A whole epoch is checked against one byte per instance, block by block, instead of
a sort of the whole order (at OLMo 3's scale ~30 GB): both ways must name the same entry."""

from __future__ import annotations

import numpy as np
import pytest

from olmo_data.dataset import order as order_module
from olmo_data.dataset.order import check_order_entries
from olmo_data.errors import DataError


def first_repeat_by_brute_force(entries: np.ndarray) -> int | None:
    seen: set[int] = set()
    for i, v in enumerate(entries.tolist()):
        if v in seen:
            return i
        seen.add(v)
    return None


@pytest.mark.parametrize("block", [7, 64, 10**6])
def test_blocks_and_one_sort_name_the_same_entry(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(order_module, "CHECK_BLOCK", block)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        entries = rng.permutation(n).astype(np.uint32)[: int(rng.integers(1, n + 1))]
        for _k in range(int(rng.integers(0, 3))):  # 0 to 2 entries overwritten with another entry's instance
            entries[int(rng.integers(len(entries)))] = entries[int(rng.integers(len(entries)))]
        want = first_repeat_by_brute_force(entries)
        if want is None:
            check_order_entries("order.npy", entries, 10, n)
            continue
        with pytest.raises(
            DataError, match=rf"order\.npy: entry {10 + want:,} is instance {int(entries[want]):,} again"
        ):
            check_order_entries("order.npy", entries, 10, n)


def test_an_entry_past_the_data_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(order_module, "CHECK_BLOCK", 4)
    entries = np.arange(20, dtype=np.uint32)
    entries[13] = 20
    with pytest.raises(DataError, match=r"entry 13 is instance 20, past the data's 20 instances"):
        check_order_entries("order.npy", entries, 0, 20)


def test_blocks_checked_in_turn_against_the_earlier_ones_name_the_first_repeat() -> None:
    """A trace reads an epoch's order a block at a time (`seen`: the instances of the blocks before): the entry
    named is the first repeat of the whole, whichever block it is in and whatever it repeats."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(2, 300))
        entries = rng.permutation(n).astype(np.uint32)
        for _k in range(int(rng.integers(0, 3))):
            entries[int(rng.integers(n))] = entries[int(rng.integers(n))]
        want, block = first_repeat_by_brute_force(entries), int(rng.integers(1, 40))
        seen = np.zeros(n, dtype=bool)
        if want is None:
            check_in_blocks(entries, block, seen)
            assert seen.all()
            continue
        with pytest.raises(DataError, match=rf"order\.npy: entry {want:,} is instance {int(entries[want]):,} again"):
            check_in_blocks(entries, block, seen)


def check_in_blocks(entries: np.ndarray, block: int, seen: np.ndarray) -> None:
    for lo in range(0, len(entries), block):
        check_order_entries("order.npy", entries[lo : lo + block], lo, len(seen), seen)
