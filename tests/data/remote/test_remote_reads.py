"""Remote reads (`olmo_data.remote`): concurrent, coalesced, cached, and retried against a server that misbehaves
on purpose (`tests/flaky_server.py`); whatever the faults, the bytes are the local ones or the read fails loudly."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.instances import open_dataset
from olmo_data.dataset.order import build_config_orders
from olmo_data.errors import DataError
from olmo_data.io import local_copy
from olmo_data.remote import RemoteOptions, RemoteReader, coalesce
from olmo_data.run.batches import inspect_batch
from tests.data.remote.test_remote import s3_server  # noqa: F401  (a fixture)
from tests.flaky_server import KINDS, Faults, FlakyServer

# no merging of neighbours unless a test is about it: each range is then a request of its own that can fail
QUICK = RemoteOptions(concurrency=8, backoff_s=0.001, max_backoff_s=0.01, deadline_s=10, coalesce_gap=0)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    """Three files of random bytes in tmp_path/www, by name."""
    rng = np.random.default_rng(0)
    www = tmp_path / "www"
    www.mkdir()
    out = {}
    for name, size in (("a.bin", 200_000), ("b.bin", 50_000), ("c.bin", 3_000)):
        out[name] = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        (www / name).write_bytes(out[name])
    return out


def random_ranges(files: dict[str, bytes], n: int, seed: int = 1) -> list[tuple[str, int, int]]:
    """Scattered ranges, some overlapping or repeated, some empty, over all files."""
    rng = np.random.default_rng(seed)
    out = []
    names = sorted(files)
    for _ in range(n):
        name = names[int(rng.integers(len(names)))]
        size = len(files[name])
        length = int(rng.integers(0, 400))
        start = int(rng.integers(0, size - length + 1))
        out.append((name, start, length))
    return out + out[:5]  # repeats


def expected(files: dict[str, bytes], ranges: list[tuple[str, int, int]]) -> list[bytes]:
    return [files[name][s : s + n] for name, s, n in ranges]


def at(url: str, ranges: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    return [(f"{url}/{name}", s, n) for name, s, n in ranges]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FlakyServer]:
    with FlakyServer(tmp_path / "www") as s:
        yield s


def test_batched_reads_equal_local_bytes(files: dict[str, bytes], server: FlakyServer) -> None:
    ranges = random_ranges(files, 300)
    reader = RemoteReader(QUICK)
    assert reader.read_many(at(server.url, ranges)) == expected(files, ranges)
    assert 1 < len(server.connections) <= QUICK.concurrency  # in flight together, over a bounded pool
    assert reader.read(f"{server.url}/b.bin", 10, 5) == files["b.bin"][10:15]
    assert reader.sizes([f"{server.url}/{n}" for n in sorted(files)]) == [len(files[n]) for n in sorted(files)]


def test_server_that_ignores_range_still_works(files: dict[str, bytes], server: FlakyServer) -> None:
    server.faults = Faults(ignore_range=True)
    ranges = random_ranges(files, 20)
    assert RemoteReader(QUICK).read_many(at(server.url, ranges)) == expected(files, ranges)
    assert server.range_requests == 0  # every answer was a 200 with the whole file


def test_a_206_that_does_not_say_its_range_is_never_trusted(files: dict[str, bytes], server: FlakyServer) -> None:
    """206, the asked length, no Content-Range and the bytes from offset 0: the length alone would pass them as
    the asked range (inspect-batch printed another batch's fingerprint, the trainer trained on it). Refused after
    its retries, naming the URL and the range."""
    server.faults = Faults(lie_range=True)
    reader = RemoteReader(RemoteOptions(concurrency=2, attempts=3, backoff_s=0.001, max_backoff_s=0.01))
    with pytest.raises(DataError, match=rf"{server.url}/b.bin: ranged read of bytes 10..19 failed after 3 attempts "):
        reader.read(f"{server.url}/b.bin", 10, 10)
    with pytest.raises(DataError, match=r"206 without a readable Content-Range \(None\)"):
        reader.read(f"{server.url}/b.bin", 10, 10)
    server.faults = Faults()
    assert reader.read(f"{server.url}/b.bin", 10, 10) == files["b.bin"][10:20]


def test_coalescing_merges_neighbours_and_keeps_its_cap() -> None:
    ranges = [("f", 100, 10), ("g", 0, 4), ("f", 0, 50), ("f", 50, 20), ("f", 1000, 8), ("f", 105, 2)]
    assert coalesce(ranges, gap=0, max_bytes=1 << 20) == [
        (("f", 0, 70), [2, 3]),  # touching ranges: one request
        (("f", 100, 10), [0, 5]),  # overlapping ones too
        (("f", 1000, 8), [4]),
        (("g", 0, 4), [1]),
    ]
    assert coalesce(ranges, gap=1000, max_bytes=1 << 20)[0] == (("f", 0, 1008), [2, 3, 0, 5, 4])
    assert [r for r, _ in coalesce(ranges, gap=1000, max_bytes=100)] == [
        ("f", 0, 70),
        ("f", 100, 10),
        ("f", 1000, 8),
        ("g", 0, 4),
    ]


def test_coalescing_reduces_the_request_count(files: dict[str, bytes], server: FlakyServer) -> None:
    ranges = [("a.bin", 1000 * k, 1000) for k in range(100)]  # 100 neighbouring instances of one file
    merged = RemoteReader(RemoteOptions(concurrency=8))
    assert merged.read_many(at(server.url, ranges)) == expected(files, ranges)
    assert merged.requests == server.range_requests == 1
    capped = RemoteReader(RemoteOptions(concurrency=8, max_request_bytes=25_000))
    assert capped.read_many(at(server.url, ranges)) == expected(files, ranges)
    assert capped.requests == 4
    apart = [("a.bin", 3000 * k, 1000) for k in range(50)]
    single = RemoteReader(RemoteOptions(concurrency=8, coalesce_gap=0))
    assert single.read_many(at(server.url, apart)) == expected(files, apart)
    assert single.requests == 50


def test_cache_serves_repeated_reads(files: dict[str, bytes], server: FlakyServer) -> None:
    reader = RemoteReader(RemoteOptions(concurrency=4, coalesce_gap=0, cache_entries=3))
    ranges = [("a.bin", 0, 10), ("a.bin", 5000, 10), ("b.bin", 0, 10)]
    reader.read_many(at(server.url, ranges))
    reader.read_many(at(server.url, ranges[::-1]))  # all three from the cache; b.bin@0 is now the oldest
    assert reader.requests == server.range_requests == 3
    reader.read(f"{server.url}/c.bin", 0, 10)  # evicts the least recently used one
    reader.read(f"{server.url}/a.bin", 0, 10)
    assert reader.requests == 4
    reader.read(f"{server.url}/b.bin", 0, 10)
    assert reader.requests == 5


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_retries_recover_the_same_bytes(
    files: dict[str, bytes], server: FlakyServer, rate: float, caplog: pytest.LogCaptureFixture
) -> None:
    server.faults = Faults(failure_rate=rate, seed=7)
    ranges = random_ranges(files, 300)
    reader = RemoteReader(QUICK)
    assert reader.read_many(at(server.url, ranges)) == expected(files, ranges)
    injected = sum(server.injected.values())
    assert f"needed {injected} retries (" in caplog.text and "every byte arrived complete" in caplog.text
    assert injected > 10 and len(server.injected) >= 5 and set(server.injected) <= set(KINDS)  # faults of all kinds
    assert reader.retries == injected == sum(reader.retry_reasons.values())  # each cost one retry
    assert reader.stats() == {"requests": reader.requests, "retries": injected}


def test_options_from_the_environment_and_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    import olmo_data.remote.reader

    monkeypatch.setenv("OLMO_DATA_REMOTE_CONCURRENCY", "5")
    monkeypatch.setenv("OLMO_DATA_REMOTE_DEADLINE_S", "1.5")
    monkeypatch.setattr(olmo_data.remote.reader, "_READER", None)
    assert olmo_data.remote.remote_reader().options.concurrency == 5
    reader = olmo_data.remote.configure(attempts=2)
    assert olmo_data.remote.remote_reader() is reader
    assert (reader.options.concurrency, reader.options.deadline_s, reader.options.attempts) == (5, 1.5, 2)
    monkeypatch.setenv("OLMO_DATA_REMOTE_ATTEMPTS", "many")
    with pytest.raises(DataError, match=r"OLMO_DATA_REMOTE_ATTEMPTS='many': expected a number like 10"):
        RemoteOptions.from_env()


def test_wrong_length_bodies_are_never_used(files: dict[str, bytes], server: FlakyServer) -> None:
    server.faults = Faults(failure_rate=1.0, kinds=("short", "long"))
    with pytest.raises(DataError, match=r"b.bin: ranged read of bytes 10..19 failed after 3 attempts .*(short|long) "):
        RemoteReader(RemoteOptions(attempts=3, backoff_s=0.001)).read(f"{server.url}/b.bin", 10, 10)
    server.faults = Faults(failure_rate=0.5, kinds=("short", "long", "truncate"), seed=3)
    server.injected.clear()
    ranges = random_ranges(files, 100)
    reader = RemoteReader(QUICK)
    assert reader.read_many(at(server.url, ranges)) == expected(files, ranges)
    assert reader.retries == sum(server.injected.values()) > 10


def test_a_server_that_stays_down_fails_promptly_naming_url_and_range(
    files: dict[str, bytes], server: FlakyServer
) -> None:
    server.faults = Faults(down=True)
    reader = RemoteReader(RemoteOptions(concurrency=4, attempts=5, backoff_s=0.001, max_backoff_s=0.01))
    began = time.monotonic()
    with pytest.raises(DataError) as e:
        reader.read_many(at(server.url, [("a.bin", 1000 * k, 100) for k in range(0, 200, 2)]))
    assert time.monotonic() - began < 2
    assert str(e.value).startswith(f"{server.url}/a.bin: ranged read of bytes ")
    assert "failed after 5 attempts" in str(e.value) and "HTTP 503" in str(e.value)
    assert server.requests < 100 * 5  # the batch's other requests stopped once one had failed for good
    with pytest.raises(DataError, match=rf"{server.url}/b.bin: ranged read of bytes 7..8 failed after 5 attempts"):
        reader.read(f"{server.url}/b.bin", 7, 2)
    with pytest.raises(DataError, match=r"c.bin: size failed after 5 attempts"):
        reader.size(f"{server.url}/c.bin")
    server.faults = Faults()  # back up: the same reader carries on
    assert reader.read(f"{server.url}/b.bin", 7, 2) == files["b.bin"][7:9]


def test_retry_after_is_honoured_within_the_deadline(server: FlakyServer, files: dict[str, bytes]) -> None:
    server.faults = Faults(down=True, retry_after="0.15")
    reader = RemoteReader(RemoteOptions(attempts=3, backoff_s=0.001, max_backoff_s=5))
    began = time.monotonic()
    with pytest.raises(DataError, match=r"failed after 3 attempts"):
        reader.read(f"{server.url}/a.bin", 0, 10)
    assert time.monotonic() - began >= 0.3  # two waits of the Retry-After, not of the 1 ms back-off
    server.faults = Faults(down=True, retry_after="60")  # longer than the deadline: give up at once, and say so
    began = time.monotonic()
    with pytest.raises(DataError, match=r"failed after 1 attempts .*HTTP 503"):
        RemoteReader(RemoteOptions(deadline_s=5)).read(f"{server.url}/a.bin", 0, 10)
    assert time.monotonic() - began < 1


def test_permanent_failures_are_not_retried(files: dict[str, bytes], server: FlakyServer) -> None:
    reader = RemoteReader(QUICK)
    with pytest.raises(DataError, match=r"missing.bin: ranged read of bytes 0..9 failed \(HTTP 404"):
        reader.read(f"{server.url}/missing.bin", 0, 10)
    with pytest.raises(DataError, match=r"c.bin: ranged read of bytes 2990..3009 failed \(the file holds 3000 bytes"):
        reader.read(f"{server.url}/c.bin", 2990, 20)
    assert server.requests == 2 and reader.retries == 0


def test_download_in_retried_chunks(files: dict[str, bytes], server: FlakyServer, tmp_path: Path) -> None:
    server.faults = Faults(failure_rate=0.3, seed=1)
    reader = RemoteReader(QUICK)
    reader.download(f"{server.url}/a.bin", str(tmp_path / "copy"), chunk_bytes=7_000)
    assert (tmp_path / "copy").read_bytes() == files["a.bin"]
    assert reader.retries > 0 and reader.requests == -(-len(files["a.bin"]) // 7_000)


def test_s3_batched_reads_equal(s3_server: str, files: dict[str, bytes]) -> None:  # noqa: F811
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="data")
    for name, data in files.items():
        s3.put_object(Bucket="data", Key=f"tok/{name}", Body=data)
    ranges = random_ranges(files, 100)
    reader = RemoteReader(QUICK)
    assert reader.read_many(at("s3://data/tok", ranges)) == expected(files, ranges)
    assert reader.read_all("s3://data/tok/c.bin") == files["c.bin"]
    assert reader.size("s3://data/tok/a.bin") == len(files["a.bin"])
    with pytest.raises(DataError, match=r"s3://data/tok/missing.bin: ranged read of bytes 0..9 failed \(ClientError"):
        reader.read("s3://data/tok/missing.bin", 0, 10)


# -- the data path end to end: inspect-batch of a token directory with label masks, under faults -------------


SEQ, GBS = 64, 48


def make_token_dir(directory: Path, seed: int = 0) -> None:
    """Four uint16 token files with label masks and tokenize-style metadata, and their manifest."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    entries = []
    for k in range(4):
        n = int(rng.integers(3_000, 9_000))
        rng.integers(0, 60_000, size=n, dtype=np.uint16).tofile(directory / f"part-{k}.npy")
        (rng.random(n) < 0.7).tofile(directory / f"mask-{k}.npy")
        ends = np.append(np.sort(rng.choice(np.arange(1, n), size=20, replace=False)), n)
        starts = np.concatenate([[0], ends[:-1]])
        rows = "".join(
            f"{s},{e},doc-{k}-{i},src-{k}.jsonl,{i + 1}\n" for i, (s, e) in enumerate(zip(starts, ends, strict=True))
        )
        with gzip.open(directory / f"part-{k}.csv.gz", "wt") as f:
            f.write(rows)
        entries.append(
            {"path": f"part-{k}.npy", "label_mask": f"mask-{k}.npy", "metadata": f"part-{k}.csv.gz", "tokens": n}
        )
    manifest = {"format": "olmo-data.tokens", "version": 1, "dtype": "uint16", "files": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_inspect_batch_under_failures_equals_local(tmp_path: Path, fresh_reader: RemoteReader) -> None:
    """With a fifth of all requests failing (manifest, sizes, order side file and slice, metadata, tokens, masks),
    inspect-batch returns the local batch: the same instances, tokens, label masks and documents."""
    www = tmp_path / "www"
    make_token_dir(www / "tok")
    local = {
        "seed": 3,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": GBS,
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": [str(www / "tok")]},
    }
    build_config_orders(local)
    shutil.copytree(tmp_path / "run" / "train_data", www / "order")
    a = inspect_batch(local, step=2, doc_index=DocIndex(str(tmp_path / "c1")))
    with FlakyServer(www, Faults(failure_rate=0.2, seed=5)) as server:
        remote = dict(local, data={"paths": [f"{server.url}/tok/"]})
        order = f"{server.url}/order"  # built for the local paths: the same files, elsewhere
        b = inspect_batch(remote, step=2, order=order, doc_index=DocIndex(str(tmp_path / "c2")), verify_data=False)
        assert sum(server.injected.values()) > 5 and fresh_reader.retries == sum(server.injected.values())
    assert a.batch_fingerprint == b.batch_fingerprint and a.data_fingerprint != b.data_fingerprint
    for x, y in zip(a.instances, b.instances, strict=True):
        assert (x.instance, x.token_offset) == (y.instance, y.token_offset)
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.label_mask, y.label_mask)  # type: ignore[arg-type]
        assert x.documents == y.documents and x.documents


def test_remote_dataset_batches_equal_local_ones(tmp_path: Path, fresh_reader: RemoteReader) -> None:
    """`get_batch` (the trainer's read) of scattered and repeated instances, tokens and masks, byte for byte."""
    make_token_dir(tmp_path / "www" / "tok", seed=1)
    local = open_dataset([str(tmp_path / "www" / "tok")], sequence_length=SEQ)
    picks = np.random.default_rng(2).integers(0, len(local), size=200)
    with FlakyServer(tmp_path / "www", Faults(failure_rate=0.1, seed=2)) as server:
        remote = open_dataset([f"{server.url}/tok/"], sequence_length=SEQ)
        got_tokens, got_masks = remote.get_batch(picks)
    want_tokens, want_masks = local.get_batch(picks)
    np.testing.assert_array_equal(got_tokens, want_tokens)
    np.testing.assert_array_equal(got_masks, want_masks)  # type: ignore[arg-type]
    assert got_masks is not None and 0 < got_masks.mean() < 1


def test_local_copy_of_a_remote_file(files: dict[str, bytes], server: FlakyServer, tmp_path: Path) -> None:
    with local_copy(f"{server.url}/b.bin", tmp_path / "dl") as path:
        assert Path(path).read_bytes() == files["b.bin"] and path.endswith("-b.bin")
    assert not list((tmp_path / "dl").iterdir())  # removed afterwards
    with local_copy(str(tmp_path / "www" / "c.bin"), tmp_path / "dl") as path:
        assert path == str(tmp_path / "www" / "c.bin")  # a local file is used in place


def test_redirects_are_followed_up_to_their_bound_then_refused_by_name(
    files: dict[str, bytes], server: FlakyServer
) -> None:
    """A chain of redirects as long as the bound is followed; one more is refused at once (not retried: a loop
    gives the same answer every time), by URL, as "too many redirects (N)", not as a connection failure."""
    server.faults = Faults(redirect_hops=5)
    reader = RemoteReader(QUICK)
    assert reader.read(f"{server.url}/b.bin", 10, 10) == files["b.bin"][10:20]
    assert reader.size(f"{server.url}/b.bin") == len(files["b.bin"])
    server.faults = Faults(redirect_hops=6)
    server.injected.clear()
    with pytest.raises(DataError) as e:
        reader.read(f"{server.url}/b.bin", 20, 10)
    assert str(e.value).startswith(
        f"{server.url}/b.bin: ranged read of bytes 20..29 failed (too many redirects (5), the last to /b.bin?hop=6: "
        "a redirect loop, or a chain longer than OLMO_DATA_REMOTE_REDIRECTS)"
    ), e.value
    assert server.injected["redirect"] == 6 and reader.retries == 0  # one request: its first answer and 5 followed
    short = RemoteReader(RemoteOptions(redirects=1, backoff_s=0.001))
    with pytest.raises(DataError, match=r"c.bin: size failed \(too many redirects \(1\), the last to /c.bin\?hop=2"):
        short.size(f"{server.url}/c.bin")
    with pytest.raises(DataError, match=r"redirects >= 0"):
        RemoteOptions(redirects=-1)


def test_a_redirect_loop_is_named_for_a_data_read(
    files: dict[str, bytes], server: FlakyServer, fresh_reader: RemoteReader
) -> None:
    """Token files behind a URL that redirects to itself: the dataset's reads fail at once naming the file and
    the loop (before: retried for the whole deadline as "connection failed")."""
    tokens = np.arange(40 * 8, dtype=np.uint16)
    tokens.tofile(server.root / "tokens.npy")
    dataset = open_dataset([f"{server.url}/tokens.npy"], sequence_length=8, dtype="uint16")
    assert dataset[3].tolist() == tokens[24:32].tolist()
    server.faults = Faults(redirect_loop="tokens.npy")
    server.injected.clear()
    began = time.monotonic()
    with pytest.raises(DataError) as e:
        dataset.get_batch([5, 6])
    assert time.monotonic() - began < 2 and "\n" not in str(e.value)
    assert str(e.value).startswith(f"{server.url}/tokens.npy: ranged read of bytes 80..111 failed (too many redirects")
    assert server.injected["redirect"] == 6 and fresh_reader.retries == 0
    with pytest.raises(DataError, match=r"tokens.npy: read failed \(too many redirects \(5\), the last to /tokens"):
        fresh_reader.read_all(f"{server.url}/tokens.npy")


def test_a_server_that_stalls_mid_body_fails_after_the_timeout(
    files: dict[str, bytes], server: FlakyServer, tmp_path: Path
) -> None:
    """Headers and half the body, then silence with the connection open: each attempt ends after `timeout_s`,
    and the read fails after its attempts naming the URL, the range and the wait (not hangs)."""
    server.faults = Faults(stall="a.bin")
    reader = RemoteReader(RemoteOptions(attempts=2, timeout_s=0.3, backoff_s=0.001))
    began = time.monotonic()
    with pytest.raises(DataError) as e:
        reader.read(f"{server.url}/a.bin", 0, 1000)
    assert 0.6 <= time.monotonic() - began < 3
    assert str(e.value).startswith(f"{server.url}/a.bin: ranged read of bytes 0..999 failed after 2 attempts in ")
    assert "(last: no answer for 0.3 s (ReadTimeoutError))" in str(e.value) and "\n" not in str(e.value)
    assert server.injected["stall"] == 2
    with pytest.raises(DataError, match=r"a.bin: ranged read of bytes 0..199999 failed after 2 attempts .*no answer"):
        reader.download(f"{server.url}/a.bin", tmp_path / "copy")
    assert reader.read(f"{server.url}/b.bin", 0, 10) == files["b.bin"][:10]  # other files are served


def test_a_streamed_document_file_that_stalls_fails_tokenize_after_the_timeout(
    files: dict[str, bytes], server: FlakyServer, tmp_path: Path, demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tokenize streams remote documents (smart-open), which waited as long as a stalled server did: it now gives
    up after the reader's timeout, in one line naming the URL, and leaves no output."""
    from olmo_data.tokenize import TokenizeOptions, tokenize

    with gzip.open(tmp_path / "www" / "docs.jsonl.gz", "wt") as f:
        for i in range(20_000):
            f.write(json.dumps({"id": str(i), "text": "hello world " * 20}) + "\n")
    server.faults = Faults(stall="docs.jsonl.gz")
    monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader(RemoteOptions(timeout_s=0.3)))
    began = time.monotonic()
    with pytest.raises(DataError, match=rf"{server.url}/docs.jsonl.gz: cannot be read past line \d+ \(ReadTimeout"):
        tokenize([f"{server.url}/docs.jsonl.gz"], tmp_path / "out", TokenizeOptions(tokenizer=demo_tokenizer))
    assert time.monotonic() - began < 10
    assert not (tmp_path / "out").exists()
