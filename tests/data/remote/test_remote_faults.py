"""Remote reads against servers that break the memory bound if believed: one that ignores `Range` (a download must
be streamed once, a range near a file's end must not hold the file), and one announcing 10**12 bytes for a side
file (refused naming the URL, before or while reading it)."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from olmo_data.errors import DataError
from olmo_data.io import cached_download, local_copy, read_bytes
from olmo_data.remote import RemoteOptions, RemoteReader
from tests.flaky_server import Faults, FlakyServer

QUICK = RemoteOptions(concurrency=8, backoff_s=0.001, max_backoff_s=0.01, deadline_s=10, coalesce_gap=0)
SIZE = 3_000_000


@pytest.fixture
def data() -> bytes:
    return np.random.default_rng(0).integers(0, 256, size=SIZE, dtype=np.uint8).tobytes()


@pytest.fixture
def server(tmp_path: Path, data: bytes) -> Iterator[FlakyServer]:
    """big.bin (`data`) and a small checksums.json, served."""
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "big.bin").write_bytes(data)
    (tmp_path / "served" / "checksums.json").write_text("{}")
    with FlakyServer(tmp_path / "served") as s:
        yield s


def test_a_server_that_ignores_range_is_streamed_once(data: bytes, server: FlakyServer, tmp_path: Path) -> None:
    server.faults = Faults(ignore_range=True)
    reader = RemoteReader(QUICK)
    reader.download(f"{server.url}/big.bin", str(tmp_path / "copy"), chunk_bytes=100_000)
    assert (tmp_path / "copy").read_bytes() == data
    assert server.bytes_sent < SIZE + 100_000  # once (and one probe byte's request), not once per chunk


def test_a_stream_cut_short_is_retried_without_giving_a_byte_twice(data: bytes, server: FlakyServer) -> None:
    server.faults = Faults(ignore_range=True, failure_rate=0.5, kinds=("truncate",), seed=0)
    reader = RemoteReader(QUICK)
    digest = hashlib.sha256()
    reader.download(f"{server.url}/big.bin", digest.update, chunk_bytes=100_000)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert reader.retries > 0


def test_a_server_that_honours_range_still_gets_concurrent_chunks(data: bytes, server: FlakyServer) -> None:
    reader = RemoteReader(QUICK)
    got = bytearray()
    reader.download(f"{server.url}/big.bin", got.extend, chunk_bytes=100_000)
    assert bytes(got) == data and reader.requests == 30  # the chunks, each ranged (plus the probe)


def test_a_range_near_the_end_from_a_server_that_ignores_range_holds_only_the_range(
    http_root: tuple[Path, str],
) -> None:
    """Python's own http.server ignores Range: the bytes before the range are dropped as they arrive (the reader
    and urllib3 hold about 5 MB however large the file; holding the file up to the range held 20 MB here)."""
    root, url = http_root
    data = bytes(range(256)) * (20 * 2**20 // 256)
    (root / "big.bin").write_bytes(data)
    reader = RemoteReader(QUICK)
    tracemalloc.start()
    try:
        got = reader.read(f"{url}/big.bin", len(data) - 100, 50)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == data[-100:-50]
    assert peak < 10 * 2**20, f"{peak} bytes held for a 50-byte range"
    with pytest.raises(DataError, match=r"big\.bin: ranged read .* failed \(the file holds 20971520 bytes"):
        reader.read(f"{url}/big.bin", len(data) - 10, 50)


def test_a_side_file_announced_at_a_terabyte_is_refused_naming_the_url(
    server: FlakyServer, fresh_reader: RemoteReader
) -> None:
    server.faults = Faults(endless="checksums.json")
    url = f"{server.url}/checksums.json"
    with pytest.raises(DataError, match=rf"^{url}: read failed \(the server announces 1,000,000,000,000 bytes"):
        read_bytes(url)
    with pytest.raises(DataError, match=rf"^{url}: download refused \(the server announces 1,000,000,000,000 bytes"):
        fresh_reader.download(url, bytearray().extend, max_bytes=1 << 20)
    assert server.bytes_sent < 64 << 20  # what the loopback's buffers took before the client hung up


def test_a_side_file_growing_past_its_cap_without_saying_its_size_is_refused(tmp_path: Path) -> None:
    """A body with no Content-Length, read to the connection's end: cut at the cap."""
    import http.server
    import threading

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(200):
                    self.wfile.write(bytes(1 << 16))
            except OSError:
                pass

        def log_message(self, *a: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/manifest.json"
        reader = RemoteReader(QUICK)
        with pytest.raises(DataError, match=rf"^{url}: read failed \(the server sends more, more than the 1,048,576"):
            reader.read_all(url, max_bytes=1 << 20)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_io_downloads_stream_from_a_server_that_ignores_range(
    data: bytes, server: FlakyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.faults = Faults(ignore_range=True)
    monkeypatch.setattr("olmo_data.remote.reader._READER", RemoteReader(QUICK))
    with local_copy(f"{server.url}/big.bin", tmp_path / "d") as path:
        assert Path(path).read_bytes() == data
    assert cached_download(f"{server.url}/big.bin").read_bytes() == data
    assert server.bytes_sent < 2 * SIZE + 100_000  # each download once (chunks of 8 MiB: one request anyway)
