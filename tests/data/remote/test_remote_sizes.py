"""Remote file sizes (olmo_data.remote.sizes): asked concurrently, once per process, cached on disk, invalidated
when the file changes; a remote token file whose .csv.gz metadata is absent has no documents, as a local one."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.token_files import token_files
from olmo_data.errors import DataError
from olmo_data.io import file_sizes
from olmo_data.remote import RemoteReader, clear_memo
from tests.data.remote.test_remote import s3_server  # noqa: F401  (a fixture)
from tests.flaky_server import Faults, FlakyServer

N, LATENCY = 200, 0.02


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The size cache on, in a folder of this test's own."""
    monkeypatch.setenv("OLMO_DATA_SIZE_CACHE", "1")
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "remote-sizes"


@pytest.fixture
def store(tmp_path: Path, fresh_reader: RemoteReader) -> Iterator[tuple[FlakyServer, list[str]]]:
    """N uint32 token files of uneven sizes behind a server with LATENCY a request, and their URLs."""
    root = tmp_path / "www"
    (root / "tok").mkdir(parents=True)
    for i in range(N):
        np.arange(i % 7 + 1, dtype=np.uint32).tofile(root / "tok" / f"part-{i:04d}.npy")
    with FlakyServer(root, Faults(latency_s=LATENCY)) as server:
        yield server, [f"{server.url}/tok/part-{i:04d}.npy" for i in range(N)]


def test_sizes_are_asked_concurrently_once_per_process_then_from_the_cache(
    store: tuple[FlakyServer, list[str]], cache: Path
) -> None:
    server, urls = store
    assert file_sizes(urls) == [4 * (i % 7 + 1) for i in range(N)]
    assert server.heads == N
    assert server.max_in_flight >= 16, server.max_in_flight  # sequential HEADs would never overlap
    assert file_sizes(urls[::-1])[0] == 4 * ((N - 1) % 7 + 1)
    assert server.heads == N  # the same process: its memo answers
    clear_memo()  # a later command: the disk cache answers, no request at all
    assert file_sizes(urls) == [4 * (i % 7 + 1) for i in range(N)]
    assert server.requests == N
    (entries,) = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    assert entries["folder"] == f"{server.url}/tok" and len(entries["files"]) == N
    assert not list(cache.glob(".tmp-*"))


def test_token_files_of_a_run_are_sized_in_one_concurrent_round(
    store: tuple[FlakyServer, list[str]], cache: Path
) -> None:
    server, urls = store
    files = token_files(urls, None, "uint32")
    assert [f.num_tokens for f in files] == [i % 7 + 1 for i in range(N)]
    assert server.heads == N and server.max_in_flight >= 16
    token_files(urls, None, "uint32")  # a second sizing (trace sizes the files twice): nothing asked
    assert server.heads == N


def test_a_rewritten_file_is_noticed_by_its_next_read_and_sized_again(
    store: tuple[FlakyServer, list[str]], cache: Path, fresh_reader: RemoteReader
) -> None:
    server, urls = store
    file_sizes(urls)
    clear_memo()
    target = server.root / "tok" / "part-0003.npy"
    np.arange(100, 104, dtype=np.uint32).tofile(target)  # same size, new bytes: a new ETag
    os.utime(target, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert file_sizes(urls)[3] == 16  # from the cache, no request: not yet noticed
    assert server.heads == N
    with pytest.raises(DataError, match=r"part-0003\.npy: ranged read of bytes 0\.\.7 failed \(the file changed "):
        fresh_reader.read(urls[3], 0, 8)
    assert file_sizes(urls)[3] == 16 and server.heads == N + 1  # the stale entry was dropped: asked again
    clear_memo()
    file_sizes(urls)
    assert server.heads == N + 1  # and cached again, as the file now is
    assert np.frombuffer(fresh_reader.read(urls[3], 0, 8), np.uint32).tolist() == [100, 101]


def test_a_missing_token_file_is_named_and_never_cached(store: tuple[FlakyServer, list[str]], cache: Path) -> None:
    server, urls = store
    with pytest.raises(DataError, match=r"/tok/gone\.npy: size failed \(HTTP 404"):
        file_sizes([*urls[:3], f"{server.url}/tok/gone.npy"])
    (server.root / "tok" / "gone.npy").write_bytes(b"\0" * 8)
    clear_memo()
    assert file_sizes([f"{server.url}/tok/gone.npy"]) == [8]


def test_absent_remote_metadata_is_no_documents_as_a_local_file_without_it(
    store: tuple[FlakyServer, list[str]], cache: Path, tmp_path: Path
) -> None:
    server, urls = store
    local = tmp_path / "local.npy"
    np.arange(4, dtype=np.uint32).tofile(local)
    docs = DocIndex(str(tmp_path / "docs"))
    assert docs.lookup(str(local), 0, 4) is None
    docs.prepare([(urls[5], f"{server.url}/tok/part-0005.csv.gz")])
    assert docs.lookup(urls[5], 0, 4) is None  # 404: no documents, not an error
    assert docs.built == 0
    heads = server.heads
    clear_memo()
    assert DocIndex(str(tmp_path / "docs")).lookup(urls[6], 0, 4) is None
    assert server.heads == heads + 1  # another file's probe; the absence itself is cached
    clear_memo()
    assert DocIndex(str(tmp_path / "docs")).lookup(urls[6], 0, 4) is None
    assert server.heads == heads + 1


def test_documents_of_many_remote_files_are_probed_together(
    store: tuple[FlakyServer, list[str]], cache: Path, tmp_path: Path
) -> None:
    """What `stats` asks of every file: its documents. The manifest is read once for the folder, the .csv.gz
    beside each file probed concurrently, and the lookups after that ask nothing."""
    server, urls = store
    docs = DocIndex(str(tmp_path / "docs"))
    docs.prepare([(u, None) for u in urls])
    assert server.requests == 1 + N  # manifest.json (404) once, one HEAD per .csv.gz (404)
    assert server.max_in_flight >= 16
    assert all(docs.lookup(u, 0, 1) is None for u in urls)
    assert server.requests == 1 + N


def test_metadata_a_manifest_names_but_missing_stays_an_error(
    store: tuple[FlakyServer, list[str]], cache: Path, tmp_path: Path
) -> None:
    """Only dolma's guess beside a file is optional: a file the manifest names is damage when absent."""
    server, urls = store
    named = f"{server.url}/tok/meta-5.csv.gz"
    docs = DocIndex(str(tmp_path / "docs"))
    docs.prepare([(urls[5], named)])
    with pytest.raises(DataError, match=r"meta-5\.csv\.gz.*HTTP 404"):
        docs.lookup(urls[5], 0, 4, metadata=named)


def test_s3_sizes_are_cached_and_checked_by_ranged_reads(
    s3_server: str,  # noqa: F811
    cache: Path,
    fresh_reader: RemoteReader,
) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="tok")
    for i in range(3):
        s3.put_object(Bucket="tok", Key=f"d/part-{i}.npy", Body=b"\1" * (8 * (i + 1)))
    urls = [f"s3://tok/d/part-{i}.npy" for i in range(3)]
    assert file_sizes(urls) == [8, 16, 24]
    assert fresh_reader.read(urls[1], 0, 4) == b"\1" * 4  # the same ETag: agrees
    clear_memo()
    s3.put_object(Bucket="tok", Key="d/part-1.npy", Body=b"\2" * 16)  # rewritten in place: a new ETag
    assert file_sizes(urls) == [8, 16, 24]  # from the cache
    with pytest.raises(DataError, match=r"s3://tok/d/part-1\.npy: ranged read of bytes 4\.\.7 failed \(the file "):
        fresh_reader.read(urls[1], 4, 4)
    (entries,) = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    assert sorted(entries["files"]) == ["part-0.npy", "part-2.npy"]  # the stale entry dropped on disk too


def test_a_long_first_sizing_draws_a_bar(
    store: tuple[FlakyServer, list[str]], cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a terminal the bar waits PROGRESS_AFTER_S before it shows; asked for (--progress), it shows at once."""
    _, urls = store
    file_sizes(urls[:50], progress=True)
    err = capsys.readouterr().err
    assert "sizing remote files: 100%" in err and "50/50" in err, err
    file_sizes(urls[:50], progress=True)  # nothing asked: no bar
    assert "sizing" not in capsys.readouterr().err
