"""The simulated store (tests/sim_store.py): its objects agree with one another and with what they stand for
(token files whose EOS ids end the documents their tokenize metadata lists, OLMo-core's order and instances, an
OLMo-core config.json), and the toolkit reaches it through its own HTTP and S3 code paths."""

from __future__ import annotations

import csv
import gzip
import io
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data.dataset.doc_index import DocIndex
from olmo_data.io import expand_patterns, file_sizes
from olmo_data.remote import RemoteReader, remote_reader
from tests import sim_store as sim
from tests.sim_store import SimServer, SimSpec

SPEC = SimSpec()


def whole(spec: SimSpec, key: str) -> bytes:
    size = sim.object_size(spec, key)
    assert size is not None, key
    return sim.object_bytes(spec, key, 0, size)


def test_token_files_are_uneven_and_their_eos_ids_end_the_documents() -> None:
    counts = sim.token_counts(SPEC)
    assert counts.sum() == SPEC.total_tokens and len(set(counts.tolist())) == SPEC.files
    assert counts[1] < SPEC.sequence_length and counts.max() > 3 * np.median(counts)
    for i in range(SPEC.files):
        raw = whole(SPEC, f"tokens/part-{i:05d}.npy")
        ids = np.frombuffer(raw, dtype="<u4")
        starts, ends = sim.documents(SPEC, i)
        assert len(ids) == counts[i] and starts[0] == 0 and ends[-1] == counts[i]
        np.testing.assert_array_equal(starts[1:], ends[:-1])
        np.testing.assert_array_equal(np.flatnonzero(ids == sim.EOS) + 1, ends)  # one EOS, at each end
        assert ids.max() <= sim.EOS and sim.PAD not in ids
    lengths = np.diff(sim.documents(SPEC, 0)[0])
    assert lengths.min() < 0.8 * SPEC.doc_tokens < 1.2 * SPEC.doc_tokens < lengths.max()  # uneven documents


def test_any_byte_range_is_the_slice_of_the_whole_object() -> None:
    rng = np.random.default_rng(0)
    keys = [k for k in sim.object_keys(SPEC) if not k.startswith("orders/")][:12]
    for key in keys:
        data = whole(SPEC, key)
        for _ in range(20):
            a = int(rng.integers(0, len(data)))
            b = int(rng.integers(a, min(len(data), a + 300_000) + 1))
            assert sim.object_bytes(SPEC, key, a, b) == data[a:b], (key, a, b)


def test_metadata_is_tokenizes_csv_gz_for_some_files_only() -> None:
    with_meta = [i for i in range(SPEC.files) if sim.has_metadata(SPEC, i)]
    assert 0 < len(with_meta) < SPEC.files
    for i in range(SPEC.files):
        key = f"tokens/part-{i:05d}.csv.gz"
        if i not in with_meta:
            assert sim.object_size(SPEC, key) is None and key not in sim.object_keys(SPEC)
            continue
        text = gzip.decompress(whole(SPEC, key)).decode()  # checks the trailer's CRC and length too
        rows = list(csv.reader(io.StringIO(text)))
        starts, ends = sim.documents(SPEC, i)
        assert [(int(r[0]), int(r[1])) for r in rows] == list(zip(starts.tolist(), ends.tolist(), strict=True))
        assert [r[2] for r in rows] == [sim.document_id(SPEC, i, j) for j in range(len(rows))]
        assert [int(r[4]) for r in rows] == list(range(1, len(rows) + 1))


def test_the_order_and_instances_follow_olmo_cores_rules() -> None:
    order = np.frombuffer(whole(SPEC, f"orders/{sim.order_name(SPEC, 1)}"), dtype="<u4")
    n = sim.dataset_size(SPEC)
    assert n == int((sim.token_counts(SPEC) // SPEC.sequence_length).sum())
    want = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(SPEC.order_seed + 1)).shuffle(want)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(sim.step_instances(SPEC, 3), want[16:24])
    per_epoch = n // SPEC.instances_per_batch
    second = sim.build_order(SPEC, 2)
    np.testing.assert_array_equal(sim.step_instances(SPEC, per_epoch + 1), second[:8])
    flat = b"".join(
        whole(SPEC, f"tokens/part-{i:05d}.npy")[: 4 * int(c) * SPEC.sequence_length]
        for i, c in enumerate(sim.instance_counts(SPEC))
    )
    tokens = np.frombuffer(flat, dtype="<u4").reshape(n, SPEC.sequence_length)
    for k in (0, 1, n // 2, n - 1):
        np.testing.assert_array_equal(sim.instance_tokens(SPEC, k), tokens[k])
    assert not replace(SPEC, with_order=False).with_order
    assert not any(k.startswith("orders/") for k in sim.object_keys(replace(SPEC, with_order=False)))


def test_olmo_core_writes_the_same_config_order_and_batches(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OLMo-core's own classes over local copies of the files: its config.json's data sections, its order file
    and its first steps' instances are the store's."""
    from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.train import Duration, TrainerConfig

    paths = []
    for i in range(SPEC.files):
        paths.append(str(tmp_path / f"part-{i:05d}.npy"))
        Path(paths[-1]).write_bytes(whole(SPEC, f"tokens/part-{i:05d}.npy"))
    dataset = NumpyFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(),
        paths=paths,
        sequence_length=SPEC.sequence_length,
        work_dir=f"{sim.CLUSTER_WORK_DIR}/dataset-cache",
    )
    loader = NumpyDataLoaderConfig(
        global_batch_size=SPEC.instances_per_batch * SPEC.sequence_length,
        seed=SPEC.order_seed,
        work_dir=f"{sim.CLUSTER_WORK_DIR}/dataset-cache",
    )
    ours = sim.olmo_core_config(SPEC, paths)
    assert ours["dataset"] == dataset.as_config_dict() and ours["data_loader"] == loader.as_config_dict()
    tokens = sim.dataset_size(SPEC) * SPEC.sequence_length
    trainer = TrainerConfig(save_folder=str(tmp_path / "save"), max_duration=Duration.tokens(tokens))
    assert ours["trainer"]["max_duration"] == trainer.as_config_dict()["max_duration"]
    work = str(tmp_path / "work")
    config = core.experiment_config(
        replace(dataset, work_dir=work),
        global_batch_size=loader.global_batch_size,
        seed=SPEC.order_seed,
        work_dir=work,
        save_folder=str(tmp_path / "save"),
    )
    reference = core.drive_loader(config, world_size=1, last_step=3, monkeypatch=monkeypatch)
    for s in reference[0]:
        np.testing.assert_array_equal(s.index, sim.step_instances(SPEC, s.step))
        for row, k in zip(s.input_ids, s.index, strict=True):
            np.testing.assert_array_equal(row, sim.instance_tokens(SPEC, int(k)))
    written = Path(work) / sim.order_name(SPEC, 1)
    assert written.read_bytes() == whole(SPEC, f"orders/{sim.order_name(SPEC, 1)}")


@pytest.fixture
def store(fresh_reader: RemoteReader) -> Iterator[SimServer]:
    with SimServer(SPEC, list_page=7) as server:
        yield server


def get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_http_answers_heads_ranges_and_misses(store: SimServer) -> None:
    key = "tokens/part-00002.npy"
    data = whole(SPEC, key)
    status, headers, _ = get(f"{store.base}/{key}", method="HEAD")
    assert status == 200 and int(headers["Content-Length"]) == len(data) and headers["ETag"]
    status, headers, body = get(f"{store.base}/{key}", {"Range": "bytes=10-4009"})
    assert status == 206 and body == data[10:4010] and headers["Content-Range"] == f"bytes 10-4009/{len(data)}"
    assert get(f"{store.base}/{key}", {"Range": "bytes=-5"})[2] == data[-5:]
    assert get(f"{store.base}/{key}", {"Range": f"bytes={len(data)}-"})[0] == 416
    assert get(f"{store.base}/tokens/part-00003.csv.gz")[0] == 404  # a file without metadata
    assert get(f"{store.url}/other/{key}")[0] == 404
    assert store.stats()["whole_gets"] == {}
    assert get(f"{store.base}/{key}")[2] == data
    assert store.stats()["whole_gets"] == {key: 1}


def test_latency_and_bandwidth_are_applied() -> None:
    largest = f"{{}}/tokens/part-{int(np.argmax(sim.token_counts(SPEC))):05d}.npy"
    with SimServer(SPEC, latency_s=0.2, bandwidth=400_000) as server:
        began = time.perf_counter()
        get(largest.format(server.base), method="HEAD")
        assert time.perf_counter() - began >= 0.2
        began = time.perf_counter()
        status, _, body = get(largest.format(server.base), {"Range": "bytes=0-199999"})
        assert status == 206 and len(body) == 200_000 and time.perf_counter() - began >= 0.2 + 0.4


@pytest.fixture
def slow_store(fresh_reader: RemoteReader) -> Iterator[SimServer]:
    """The store with 50 ms a request: concurrent requests overlap whatever the machine's load (without a
    latency each is answered before the next is sent, and concurrency cannot be seen)."""
    with SimServer(SPEC, list_page=7, latency_s=0.05) as server:
        yield server


def test_the_toolkit_sizes_and_reads_it_over_http(slow_store: SimServer) -> None:
    store = slow_store
    urls = store.http_urls()
    assert file_sizes(urls) == [4 * int(n) for n in sim.token_counts(SPEC)]
    assert store.stats()["heads"] == SPEC.files and store.stats()["max_in_flight"] > 1
    spans = [(urls[i], 4 * 37 * i, 4 * 50) for i in range(2, SPEC.files)]
    for (url, start, _), got in zip(spans, remote_reader().read_many(spans), strict=True):
        i = urls.index(url)
        np.testing.assert_array_equal(np.frombuffer(got, "<u4"), sim.tokens(SPEC, i, start // 4, start // 4 + 50))
    index = DocIndex()
    index.prepare([(u, None) for u in urls])
    for i, url in enumerate(urls[:8]):
        found = index.lookup(url, 0, int(sim.token_counts(SPEC)[i]), num_tokens=int(sim.token_counts(SPEC)[i]))
        if not sim.has_metadata(SPEC, i):
            assert found is None  # no .csv.gz (404): a file without documents, as a local one
            continue
        starts, ends = sim.documents(SPEC, i)
        assert found is not None and [(d.start, d.end) for d in found] == list(
            zip(starts.tolist(), ends.tolist(), strict=True)
        )
        assert [d.id for d in found] == [sim.document_id(SPEC, i, j) for j in range(len(starts))]
    assert store.stats()["whole_gets"] == {}  # metadata downloads are ranged too; token files never whole


def test_the_toolkit_lists_sizes_and_reads_it_over_s3(store: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    for key, value in {
        "AWS_ENDPOINT_URL": store.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    listed = expand_patterns([f"s3://{SPEC.bucket}/tokens/part-*.npy"])
    assert listed == store.s3_urls() and store.stats()["lists"] >= SPEC.files // 7  # pages of 7 keys
    assert file_sizes(listed) == [4 * int(n) for n in sim.token_counts(SPEC)]
    got = remote_reader().read(listed[5], 400, 4000)
    np.testing.assert_array_equal(np.frombuffer(got, "<u4"), sim.tokens(SPEC, 5, 100, 1100))
    meta = [u[: -len(".npy")] + ".csv.gz" for u in listed[:4]]
    sizes = file_sizes(meta, missing_ok=True)
    assert [s is not None for s in sizes] == [sim.has_metadata(SPEC, i) for i in range(4)]
