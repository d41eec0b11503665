"""The instance index: OLMo's per-file cutting, dtypes from manifests, label masks, fingerprints, remote
reads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.instances import open_dataset, open_from_config
from olmo_data.errors import DataError
from olmo_data.remote import RemoteOptions, RemoteReader
from tests.flaky_server import FlakyServer


def write_tokens(path: Path, tokens: np.ndarray, dtype: str = "uint16") -> str:
    np.asarray(tokens, dtype=dtype).tofile(path)
    return str(path)


def write_manifest(directory: Path, names: list[str], dtype: str, tokens: list[int]) -> None:
    files = [
        {"path": n, "metadata": n.replace(".npy", ".csv.gz"), "documents": 1, "tokens": t, "input": 0}
        for n, t in zip(names, tokens, strict=True)
    ]
    (directory / "manifest.json").write_text(
        json.dumps({"format": "olmo-data.tokens", "version": 1, "dtype": dtype, "files": files})
    )


def olmo_reference_instances(arrays: list[np.ndarray], seq_len: int) -> np.ndarray:
    """OLMo's MemMapDataset rule written independently: each file cut alone, leftovers dropped, files in
    order."""
    chunks = [a[: (len(a) // seq_len) * seq_len].reshape(-1, seq_len) for a in arrays]
    return np.concatenate(chunks).astype(np.int64)


def test_per_file_cutting_matches_olmo(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 60000, size=n) for n in (10, 7, 2, 25)]  # 2 tokens: a file with no instance
    paths = [write_tokens(tmp_path / f"f{i}.npy", a) for i, a in enumerate(arrays)]
    ds = open_dataset(paths, sequence_length=3)
    ref = olmo_reference_instances(arrays, 3)
    assert len(ds) == len(ref) == 3 + 2 + 0 + 8
    tokens, masks = ds.get_batch(np.arange(len(ds))[::-1])
    assert masks is None
    assert tokens.dtype == np.int64 and tokens.shape == (len(ref), 3)
    np.testing.assert_array_equal(tokens, ref[::-1])
    # instance 5 is the first of the fourth file (the third has none)
    assert ds.locate(5) == (os.path.abspath(paths[3]), 0)
    assert ds.locate(4) == (os.path.abspath(paths[1]), 3)
    np.testing.assert_array_equal(ds[7], arrays[3][6:9])


def test_directory_uses_manifest_dtype_and_order(tmp_path: Path) -> None:
    a = np.arange(100_000, 100_020)
    b = np.arange(70_000, 70_008)
    write_tokens(tmp_path / "part-1.npy", b, "uint32")
    write_tokens(tmp_path / "part-0.npy", a, "uint32")
    write_manifest(tmp_path, ["part-1.npy", "part-0.npy"], "uint32", [8, 20])  # manifest order, not name order
    ds = open_dataset([str(tmp_path)], sequence_length=4)
    assert len(ds) == 2 + 5
    np.testing.assert_array_equal(ds.get_batch([0, 2])[0], [b[0:4], a[0:4]])
    with pytest.raises(DataError, match=r"dtype uint16 was requested but the directory's manifest says uint32"):
        open_dataset([str(tmp_path)], sequence_length=4, dtype="uint16")
    with pytest.raises(DataError, match=r"dtype uint16 was requested but the directory's manifest says uint32"):
        open_dataset([str(tmp_path / "part-0.npy")], sequence_length=4, dtype="uint16")


def test_manifest_token_count_disagreeing_with_file(tmp_path: Path) -> None:
    write_tokens(tmp_path / "p.npy", np.arange(10), "uint16")
    write_manifest(tmp_path, ["p.npy"], "uint16", [12])
    with pytest.raises(DataError, match=r"p.npy: the manifest says 12 tokens but the file holds 10"):
        open_dataset([str(tmp_path)], sequence_length=4)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope.npy: token file not found"):
        open_dataset([str(tmp_path / "nope.npy")], sequence_length=4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: a directory without manifest.json"):
        open_dataset([str(tmp_path / "empty")], sequence_length=4)
    (tmp_path / "odd.npy").write_bytes(b"\x00" * 5)
    with pytest.raises(DataError, match=r"odd.npy: 5 bytes is not a whole number of uint16 tokens"):
        open_dataset([str(tmp_path / "odd.npy")], sequence_length=2)
    with pytest.raises(DataError, match=r"either data.paths .* or data.mix"):
        open_dataset(sequence_length=4)
    with pytest.raises(DataError, match=r"sequence_length must be a positive"):
        open_dataset([write_tokens(tmp_path / "x.npy", np.arange(4))], sequence_length=0)


def test_label_masks(tmp_path: Path) -> None:
    t0 = write_tokens(tmp_path / "a.npy", np.arange(8))
    t1 = write_tokens(tmp_path / "b.npy", np.arange(6))
    m0 = np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=bool)
    m1 = np.array([0, 1, 1, 0, 1, 1], dtype=bool)
    m0.tofile(tmp_path / "a.mask.npy")
    m1.tofile(tmp_path / "b.mask.npy")
    ds = open_dataset(
        [t0, t1],
        sequence_length=3,
        label_mask_paths=[str(tmp_path / "a.mask.npy"), str(tmp_path / "b.mask.npy")],
    )
    tokens, masks = ds.get_batch([3, 1, 2])
    assert masks is not None and masks.dtype == bool
    np.testing.assert_array_equal(masks, [m1[3:6], m0[3:6], m1[0:3]])
    np.testing.assert_array_equal(tokens, [np.arange(3, 6), np.arange(3, 6), np.arange(0, 3)])
    with pytest.raises(DataError, match=r"label_mask_paths lists 1 files but data.paths expands to 2"):
        open_dataset([t0, t1], sequence_length=3, label_mask_paths=[str(tmp_path / "a.mask.npy")])
    with pytest.raises(DataError, match=r"b.mask.npy: the label mask has 6 entries but its token file .*a.npy has 8"):
        open_dataset([t0], sequence_length=3, label_mask_paths=[str(tmp_path / "b.mask.npy")])


def test_fingerprint_tracks_the_data(tmp_path: Path) -> None:
    a = write_tokens(tmp_path / "a.npy", np.arange(40))
    b = write_tokens(tmp_path / "b.npy", np.arange(30))
    fp = open_dataset([a, b], sequence_length=4).fingerprint()
    assert fp == open_dataset([a, b], sequence_length=4).fingerprint()  # deterministic
    assert fp != open_dataset([b, a], sequence_length=4).fingerprint()  # order matters
    assert fp != open_dataset([a], sequence_length=4).fingerprint()
    assert fp != open_dataset([a, b], sequence_length=5).fingerprint()
    write_tokens(tmp_path / "b.npy", np.arange(34))
    assert fp != open_dataset([a, b], sequence_length=4).fingerprint()  # a file grew


def test_open_from_config(tmp_path: Path) -> None:
    a = write_tokens(tmp_path / "a.npy", np.arange(40), "uint32")
    cfg = {"model": {"max_sequence_length": 8}, "data": {"paths": ["a.npy"], "dtype": "uint32"}}
    ds = open_from_config(cfg, base_dir=str(tmp_path))
    assert len(ds) == 5 and ds.locate(1) == (a, 8)
    with pytest.raises(DataError, match=r"model.max_sequence_length is missing"):
        open_from_config({"data": {"paths": [a]}})
    with pytest.raises(DataError, match=r"data.paths is missing or empty"):
        open_from_config({"model": {"max_sequence_length": 8}, "data": {}})


# -- remote reads --------------------------------------------------------------------------------------------


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[Path, str, FlakyServer]]:
    """(served directory, base URL, the server, which counts connections and range requests)."""
    root = tmp_path / "www"
    root.mkdir()
    with FlakyServer(root) as server:
        yield root, server.url, server


def test_http_dataset_reads_ranges_with_cache(
    http_server: tuple[Path, str, FlakyServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, url, server = http_server
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 2**31, size=n) for n in (1000, 555)]
    for i, a in enumerate(arrays):
        write_tokens(root / f"part-{i}.npy", a, "uint32")
    write_manifest(root, ["part-0.npy", "part-1.npy"], "uint32", [1000, 555])
    reader = RemoteReader(RemoteOptions(cache_entries=8, coalesce_gap=0))  # no merging: one request per instance
    monkeypatch.setattr("olmo_data.remote.reader._READER", reader)
    ds = open_dataset([url + "/"], sequence_length=50)
    ref = olmo_reference_instances(arrays, 50)
    assert len(ds) == len(ref) == 20 + 11
    picks = np.array([30, 0, 19, 20, 7])
    np.testing.assert_array_equal(ds.get_batch(picks)[0], ref[picks])
    assert reader.requests == 5 and server.range_requests == 5
    ds.get_batch([30, 0])  # served from the cache
    assert reader.requests == 5 and server.range_requests == 5
    assert ds.locate(20) == (f"{url}/part-1.npy", 0)


def test_http_connection_reuse(http_server: tuple[Path, str, FlakyServer]) -> None:
    root, url, server = http_server
    write_tokens(root / "t.npy", np.arange(4000), "uint16")
    reader = RemoteReader()
    got = [np.frombuffer(reader.read(f"{url}/t.npy", 2 * k * 100, 200), dtype="<u2") for k in range(10)]
    for k, g in enumerate(got):
        np.testing.assert_array_equal(g, np.arange(k * 100, k * 100 + 100))
    assert server.range_requests == 10
    assert len(server.connections) == 1  # one kept-alive connection served every range
    with pytest.raises(DataError, match=r"missing.npy: ranged read of bytes 0..9 failed"):
        reader.read(f"{url}/missing.npy", 0, 10)


def test_s3_ranged_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        import boto3

        s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        s3.create_bucket(Bucket="data")
        arr = np.arange(50_000, 50_000 + 1000, dtype=np.uint16)
        s3.put_object(Bucket="data", Key="tok/a.npy", Body=arr.tobytes())
        monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader())
        ds = open_dataset(["s3://data/tok/a.npy"], sequence_length=64, dtype="uint16")
        assert len(ds) == 1000 // 64
        np.testing.assert_array_equal(ds.get_batch([3, 14])[0], [arr[192:256], arr[896:960]])
    finally:
        server.stop()


def test_http_token_files_listed_one_by_one(
    http_server: tuple[Path, str, FlakyServer], fresh_reader: RemoteReader
) -> None:
    """OLMo configs list token-file URLs without a manifest: sizes come from HEAD requests, dtype from data.dtype."""
    root, url, _ = http_server
    arrays = [np.arange(k * 1000, k * 1000 + 100 + 7 * k) for k in range(5)]
    for k, a in enumerate(arrays):
        write_tokens(root / f"f{k}.npy", a, "uint16")
    ds = open_dataset([f"{url}/f{k}.npy" for k in range(5)], sequence_length=16, dtype="uint16")
    ref = olmo_reference_instances(arrays, 16)
    assert len(ds) == len(ref)
    np.testing.assert_array_equal(ds.get_batch(np.arange(len(ds)))[0], ref)
    with pytest.raises(DataError, match=r"f9.npy: cannot read the token file's size"):
        open_dataset([f"{url}/f9.npy"], sequence_length=16)


def test_chat_directory_brings_its_label_masks_and_length(tmp_path: Path) -> None:
    """A prepare-tulu directory: the manifest names the label mask, and its instances are whole examples."""
    write_tokens(tmp_path / "input_ids.npy", np.arange(24), "uint16")
    mask = np.arange(24) % 3 == 0
    mask.tofile(tmp_path / "label_mask.npy")
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "format": "olmo-data.chat",
                "version": 1,
                "dtype": "uint16",
                "sequence_length": 8,
                "files": [{"path": "input_ids.npy", "label_mask": "label_mask.npy", "tokens": 24}],
            }
        )
    )
    ds = open_dataset([str(tmp_path)], sequence_length=8)
    tokens, masks = ds.get_batch([2, 0])
    assert masks is not None
    np.testing.assert_array_equal(masks, [mask[16:24], mask[0:8]])
    np.testing.assert_array_equal(tokens, [np.arange(16, 24), np.arange(0, 8)])
    with pytest.raises(DataError, match=r"prepared as instances of 8 tokens, but the sequence length is 12"):
        open_dataset([str(tmp_path)], sequence_length=12)
