"""A remote file's stat and first bytes from one ranged GET (olmo_data.remote.starts): what a HEAD would have said,
kept where a HEAD's answer is kept, over HTTP (ranged or not) and S3, for empty, small, large and missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmo_data.errors import DataError
from olmo_data.io import file_sizes
from olmo_data.remote import RemoteReader, clear_memo, stat_and_start_many
from tests.data.remote.test_remote import s3_server  # noqa: F401  (a fixture)
from tests.flaky_server import Faults, FlakyServer

FIRST = 1000
FILES = {"empty.bin": b"", "small.bin": bytes(range(10)), "large.bin": bytes(i % 251 for i in range(100_000))}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OLMO_DATA_SIZE_CACHE", "1")
    return tmp_path / "cache"


def served(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    for name, data in FILES.items():
        (root / name).write_bytes(data)
    return root


def check(stats: dict, starts: dict, urls: dict[str, str]) -> None:
    assert {n: stats[u].size for n, u in urls.items()} == {**{n: len(d) for n, d in FILES.items()}, "absent": None}
    assert {n: starts.get(u) for n, u in urls.items()} == {
        **{n: d[:FIRST] for n, d in FILES.items()},
        "absent": None,
    }
    assert stats[urls["large.bin"]].etag  # (what tells a rewritten file from this one, as a HEAD gives it)


def test_one_ranged_get_gives_the_stat_and_the_first_bytes_kept_as_a_heads_would_be(
    tmp_path: Path, cache: Path, fresh_reader: RemoteReader
) -> None:
    root = served(tmp_path)
    with FlakyServer(root) as server:
        urls = {n: f"{server.url}/{n}" for n in [*FILES, "absent"]}
        stats, starts = stat_and_start_many(fresh_reader, list(urls.values()), FIRST, cache)
        check(stats, starts, urls)
        assert server.heads == 1  # only the empty file's (no byte to range: 416), the others one GET each
        assert server.requests == len(urls) + 1
        again = stat_and_start_many(fresh_reader, list(urls.values()), FIRST, cache)
        assert again[1] == {} and server.requests == len(urls) + 1  # this process's memo: nothing asked
        clear_memo()  # a later command: the disk cache, as for a HEAD's answer (the absence too)
        assert stat_and_start_many(fresh_reader, list(urls.values()), FIRST, cache)[1] == {}
        assert server.requests == len(urls) + 1
        (root / "large.bin").write_bytes(FILES["large.bin"] + b"more")  # rewritten: a later read sees it
        with pytest.raises(DataError, match="large.bin.*changed since its size was cached"):
            fresh_reader.read(urls["large.bin"], 0, 10)


def test_a_server_that_ignores_range_gives_its_whole_files_size(
    tmp_path: Path, cache: Path, fresh_reader: RemoteReader
) -> None:
    with FlakyServer(served(tmp_path), Faults(ignore_range=True)) as server:
        urls = {n: f"{server.url}/{n}" for n in [*FILES, "absent"]}
        stats, starts = stat_and_start_many(fresh_reader, list(urls.values()), FIRST, None)
        check(stats, starts, urls)
        assert server.heads == 0


def test_over_s3(s3_server: str, tmp_path: Path, cache: Path, fresh_reader: RemoteReader) -> None:  # noqa: F811
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="bkt")
    for name, data in FILES.items():
        s3.put_object(Bucket="bkt", Key=f"k/{name}", Body=data)
    urls = {n: f"s3://bkt/k/{n}" for n in [*FILES, "absent"]}
    stats, starts = stat_and_start_many(fresh_reader, list(urls.values()), FIRST, cache)
    check(stats, starts, urls)
    clear_memo()
    assert file_sizes([urls["large.bin"]]) == [len(FILES["large.bin"])]  # (from the disk cache)


def test_a_range_answer_without_the_size_is_sized_by_a_head(fresh_reader: RemoteReader) -> None:
    """`Content-Range: bytes 0-N/*` (RFC 9110 allows an unknown size): the bytes kept, the size from a HEAD."""
    import http.server
    import threading

    data = FILES["large.bin"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

        def do_GET(self) -> None:
            end = int(self.headers["Range"].split("-")[1])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-{end}/*")
            self.send_header("Content-Length", str(end + 1))
            self.end_headers()
            self.wfile.write(data[: end + 1])

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/f"
        stats, starts = stat_and_start_many(fresh_reader, [url], FIRST, None)
        assert stats[url].size == len(data) and starts[url] == data[:FIRST]
    finally:
        server.shutdown()
        server.server_close()
