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
