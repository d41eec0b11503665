"""Data orders: OLMo's permutation, batch formula, step/epoch mapping, rank slices, stored orders and their
checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.instances import open_dataset
from olmo_data.dataset.order import (
    build_order,
    ensure_order,
    global_batch_indices,
    load_order,
    order_path_for_epoch,
    read_order_range,
    side_file,
    step_position,
    write_order,
)
from olmo_data.dataset.steps import batch_position, rank_slice
from olmo_data.errors import DataError


def olmo_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """OLMo's global indices exactly as OLMo computes them: a uint32 arange shuffled by PCG64(seed + epoch)."""
    indices = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(indices)
    return indices


@pytest.mark.parametrize(("n", "seed", "epoch"), [(1, 0, 0), (10, 6198, 0), (1000, 6198, 1), (12345, 17, 3)])
def test_permutation_is_olmos(n: int, seed: int, epoch: int) -> None:
    order = build_order(n, seed, epoch)
    assert order.dtype == np.uint32
    np.testing.assert_array_equal(order, olmo_permutation(n, seed, epoch))
    assert sorted(order.tolist()) == list(range(n))  # a permutation


# Computed once with numpy 2.4 as `a = np.arange(n); np.random.Generator(np.random.PCG64(seed)).shuffle(a)`.
# They pin numpy's shuffle itself: if a numpy release ever changed it, published OLMo orders would stop
# matching, and this test says so before any order is built with the changed generator.
PINNED = {
    (8, 0): [2, 4, 3, 6, 5, 0, 1, 7],
    (13, 42): [0, 12, 7, 10, 9, 3, 6, 5, 2, 4, 11, 1, 8],
    (20, 6198): [17, 4, 14, 3, 5, 12, 6, 15, 18, 13, 10, 11, 2, 19, 0, 16, 7, 9, 8, 1],
}


@pytest.mark.parametrize(("n", "seed"), sorted(PINNED))
def test_pinned_small_permutations(n: int, seed: int) -> None:
    assert build_order(n, seed, 0).tolist() == PINNED[(n, seed)]
    if seed > 0:  # the generator is seeded with seed + epoch
        assert build_order(n, seed - 1, 1).tolist() == PINNED[(n, seed)]


def test_epochs_differ_and_are_deterministic() -> None:
    a0, a1 = build_order(500, 3, 0), build_order(500, 3, 1)
    assert not np.array_equal(a0, a1)
    np.testing.assert_array_equal(a1, build_order(500, 4, 0))  # seed + epoch is the stream, as in OLMo
    np.testing.assert_array_equal(a0, build_order(500, 3, 0))


def test_uint64_for_huge_orders() -> None:
    from olmo_data.dataset.order import order_dtype

    assert order_dtype(2**32 - 1) == np.uint32
    assert order_dtype(2**32) == np.uint64


def test_readme_batch_formula_and_steps(tmp_path: Path) -> None:
    n, gbs, seed = 103, 8, 9
    order = build_order(n, seed, 0)
    per_epoch = n // gbs
    write_order(str(tmp_path / "global_indices.npy"), order, seed=seed, epoch=0)
    for b in range(per_epoch):  # step b + 1 reads batch b of the stored order, as the trainer does
        got = global_batch_indices(str(tmp_path), b + 1, gbs, num_instances=n)
        np.testing.assert_array_equal(got, order[b * gbs : (b + 1) * gbs])
    # step N trains global batch N-1; epochs follow one another
    assert step_position(1, gbs, n) == batch_position(0, gbs, n)
    pos = step_position(per_epoch + 2, gbs, n)
    assert (pos.epoch, pos.batch_in_epoch, pos.global_batch, pos.step) == (1, 1, per_epoch + 1, per_epoch + 2)
    with pytest.raises(DataError, match=r"training steps count from 1"):
        step_position(0, gbs, n)
    with pytest.raises(DataError, match=r"the data has 7 instances, fewer than one global batch of 8"):
        step_position(1, gbs, 7)


def test_rank_slices_cover_each_batch_exactly_once() -> None:
    n, gbs = 1000, 24
    order = build_order(n, 5, 0)
    for b in range(n // gbs):
        batch = order[b * gbs : (b + 1) * gbs]
        for world in [w for w in range(1, gbs + 1) if gbs % w == 0]:
            parts = [rank_slice(batch, r, world) for r in range(world)]
            assert all(len(p) == gbs // world for p in parts)
            merged = np.concatenate(parts)
            assert sorted(merged.tolist()) == sorted(batch.tolist())  # every instance once, none twice
            # rank r holds positions r, r+W, ...: interleaving the parts gives back the batch
            np.testing.assert_array_equal(np.stack(parts, axis=1).reshape(-1), batch)
    with pytest.raises(DataError, match=r"world size 5 does not divide the global batch size 24"):
        rank_slice(order[:gbs], 0, 5)
    with pytest.raises(DataError, match=r"rank must be in \[0, world size\), got rank 4 of world size 4"):
        rank_slice(order[:gbs], 4, 4)


def _dataset(tmp_path: Path, sizes: tuple[int, ...] = (400, 250)) -> list[str]:
    paths = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"t{i}.npy"
        np.arange(n, dtype=np.uint16).tofile(p)
        paths.append(str(p))
    return paths


def test_ensure_order_builds_once_and_checks_the_data(tmp_path: Path) -> None:
    paths = _dataset(tmp_path)
    ds = open_dataset(paths, sequence_length=10)
    train_data = tmp_path / "run" / "train_data"
    path = ensure_order(str(train_data), ds, seed=6, epoch=0)
    assert path == str(train_data / "global_indices.npy")
    raw = np.fromfile(path, dtype="<u4")  # headerless uint32, as OLMo's
    np.testing.assert_array_equal(raw, olmo_permutation(len(ds), 6, 0))
    info = json.loads(Path(side_file(path)).read_text())
    assert (info["num_instances"], info["seed"], info["epoch"], info["data_fingerprint"]) == (
        65,
        6,
        0,
        ds.fingerprint(),
    )
    mtime = Path(path).stat().st_mtime_ns
    assert ensure_order(str(train_data), ds, seed=6, epoch=0) == path
    assert Path(path).stat().st_mtime_ns == mtime  # reused, not rebuilt
    e1 = ensure_order(str(train_data), ds, seed=6, epoch=1)
    assert e1 == str(train_data / "global_indices_epoch1.npy")
    np.testing.assert_array_equal(load_order(e1), olmo_permutation(len(ds), 6, 1))
    assert not list(train_data.glob(".tmp-*"))

    # the data paths changed since the order was built
    changed = open_dataset(paths[:1], sequence_length=10)
    with pytest.raises(
        DataError,
        match=r"global_indices.npy: this order was built for other data .*data paths "
        r"changed since the order was built",
    ):
        ensure_order(str(train_data), changed, seed=6, epoch=0)
    with pytest.raises(DataError, match=r"this order was built for other data"):
        load_order(path, expected_fingerprint=changed.fingerprint())
    with pytest.raises(DataError, match=r"the order was built with seed=6, but seed=7 was asked for"):
        ensure_order(str(train_data), ds, seed=7, epoch=0)


def test_ensure_order_accepts_olmo_order_without_side_file(tmp_path: Path) -> None:
    ds = open_dataset(_dataset(tmp_path), sequence_length=10)
    olmo_dir = tmp_path / "olmo"
    olmo_dir.mkdir()
    olmo_permutation(len(ds), 1, 0)[:64].astype(np.uint32).tofile(olmo_dir / "global_indices.npy")  # OLMo trims
    assert ensure_order(str(olmo_dir), ds, seed=1, epoch=0) == str(olmo_dir / "global_indices.npy")
    olmo_permutation(200, 1, 0).astype(np.uint32).tofile(olmo_dir / "global_indices.npy")
    with pytest.raises(DataError, match=r"800 bytes is not an order of 65 uint32 instance numbers"):
        ensure_order(str(olmo_dir), ds, seed=1, epoch=0)
    # OLMo's default (drop_last: false) pads to a multiple of the world size (8) with the order's own head
    order = olmo_permutation(len(ds), 1, 0).astype(np.uint32)
    np.concatenate([order, order[:7]]).tofile(olmo_dir / "global_indices.npy")
    assert ensure_order(str(olmo_dir), ds, seed=1, epoch=0) == str(olmo_dir / "global_indices.npy")
    np.concatenate([order, order[1:8]]).tofile(olmo_dir / "global_indices.npy")  # a tail that is not its head
    with pytest.raises(DataError, match=r"72 instance numbers for 65 instances, but its last 7 are not its first 7"):
        ensure_order(str(olmo_dir), ds, seed=1, epoch=0)


def test_global_batch_indices_across_epochs(tmp_path: Path) -> None:
    ds = open_dataset(_dataset(tmp_path), sequence_length=10)  # 65 instances
    gbs, seed = 16, 11  # 4 batches per epoch, one instance dropped
    train_data = str(tmp_path / "train_data")
    ensure_order(train_data, ds, seed, 0)
    ensure_order(train_data, ds, seed, 1)
    for step in range(1, 9):
        epoch, b = (step - 1) // 4, (step - 1) % 4
        expect = olmo_permutation(65, seed, epoch)[b * gbs : (b + 1) * gbs]
        got = global_batch_indices(
            train_data, step, gbs, num_instances=len(ds), expected_fingerprint=ds.fingerprint(), seed=seed
        )
        np.testing.assert_array_equal(got, expect)
    # an order built with another seed is refused wherever it is read
    other_seed = rf"global_indices.npy: this order was built with seed {seed}, but the config's seed is 12"
    with pytest.raises(DataError, match=other_seed):
        global_batch_indices(train_data, 1, gbs, num_instances=len(ds), seed=12)
    with pytest.raises(DataError, match=other_seed):
        read_order_range(order_path_for_epoch(train_data, 0), 0, gbs, seed=12)
    with pytest.raises(DataError, match=other_seed):
        load_order(order_path_for_epoch(train_data, 0), seed=12)
    with pytest.raises(
        DataError,
        match=r"global_indices_epoch2.npy: order file not found \(step 9 is batch 0 of "
        r"epoch 2, 4 batches per epoch\)",
    ):
        global_batch_indices(train_data, 9, gbs, num_instances=len(ds))
    # an explicit, shorter order file: a step past its end
    short = tmp_path / "short.npy"
    olmo_permutation(65, seed, 0)[:32].astype(np.uint32).tofile(short)
    np.testing.assert_array_equal(
        global_batch_indices(str(short), 2, gbs, num_instances=65), olmo_permutation(65, seed, 0)[16:32]
    )
    with pytest.raises(
        DataError,
        match=r"step 3 is past the end of the order: .*short.npy: the order holds 32 "
        r"instances, fewer than the 48 needed",
    ):
        global_batch_indices(str(short), 3, gbs, num_instances=65)


def test_order_paths_and_missing_files(tmp_path: Path) -> None:
    assert order_path_for_epoch("run/train_data", 0) == "run/train_data/global_indices.npy"
    assert order_path_for_epoch("run/train_data/", 2) == "run/train_data/global_indices_epoch2.npy"
    assert order_path_for_epoch("x/my_order.npy", 0) == "x/my_order.npy"
    assert order_path_for_epoch("x/my_order.npy", 3) == "x/my_order_epoch3.npy"
    with pytest.raises(DataError, match=r"nope.npy: order file not found"):
        load_order(str(tmp_path / "nope.npy"))
    with pytest.raises(DataError, match=r"nope.npy: order file not found; build it with `olmo-data build-order"):
        read_order_range(str(tmp_path / "nope.npy"), 0, 4)


def test_write_order_is_atomic_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "train_data" / "global_indices.npy"

    def boom(self: np.ndarray, *a: object, **k: object) -> None:
        raise OSError("disk full")

    order = build_order(100, 0, 0)
    monkeypatch.setattr(np, "ascontiguousarray", lambda *a, **k: type("A", (), {"tofile": boom})())
    with pytest.raises(OSError, match="disk full"):
        write_order(str(target), order, seed=0, epoch=0)
    assert not target.exists()
    assert not list(target.parent.glob(".tmp-*"))


def test_concurrent_ensure_order_gives_one_complete_order(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ds = open_dataset(_dataset(tmp_path, (4000, 3000)), sequence_length=3)
    train_data = str(tmp_path / "train_data")
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: ensure_order(train_data, ds, 8, 0), range(8)))
    assert set(paths) == {str(tmp_path / "train_data" / "global_indices.npy")}
    np.testing.assert_array_equal(load_order(paths[0]), olmo_permutation(len(ds), 8, 0))
    assert sorted(p.name for p in (tmp_path / "train_data").iterdir()) == ["global_indices.json", "global_indices.npy"]


def test_both_shuffle_paths_give_the_same_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = build_order(5000, 21, 2)
    monkeypatch.setattr("olmo_data.dataset.order.FAST_SHUFFLE_MAX_BYTES", 0)  # force the in-place uint32 path
    slow = build_order(5000, 21, 2)
    assert fast.dtype == slow.dtype == np.uint32
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(slow, olmo_permutation(5000, 21, 2))


@pytest.mark.parametrize("dtype", ["float32", "uint16", "int16", "int64"])
def test_a_side_file_that_lies_about_the_dtype_is_refused(tmp_path: Path, dtype: str) -> None:
    """With "float32" every entry read as instance 0, with uint16 the batches interleaved zeros: exit 0 both
    times. Refused instead, naming the side file."""
    ds = open_dataset(_dataset(tmp_path), sequence_length=10)
    path = ensure_order(str(tmp_path / "run" / "train_data"), ds, seed=6, epoch=0)
    info = json.loads(Path(side_file(path)).read_text())
    Path(side_file(path)).write_text(json.dumps({**info, "dtype": dtype}))
    message = rf"{side_file(path)}: dtype '{dtype}'; an order holds uint32"
    with pytest.raises(DataError, match=message):
        read_order_range(path, 0, 8, expected_fingerprint=ds.fingerprint())
    with pytest.raises(DataError, match=message):
        load_order(path)


def test_an_order_whose_length_differs_from_its_side_file_is_refused(tmp_path: Path) -> None:
    ds = open_dataset(_dataset(tmp_path), sequence_length=10)
    path = ensure_order(str(tmp_path / "run" / "train_data"), ds, seed=6, epoch=0)
    info = json.loads(Path(side_file(path)).read_text())
    Path(side_file(path)).write_text(json.dumps({**info, "num_instances": 64}))
    message = r"global_indices.npy: holds 65 entries of uint32, but its side file records 64"
    with pytest.raises(DataError, match=message):
        read_order_range(path, 0, 8)
    with pytest.raises(DataError, match=message):
        load_order(path)
