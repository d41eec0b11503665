"""Remote manifests: only a genuine "not found" means "no manifest"; other failures must not guess the dtype."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from olmo_data.dataset.manifest import read_manifest
from olmo_data.dataset.token_files import token_files
from olmo_data.errors import DataError
from tests.data.remote.test_remote import s3_server  # noqa: F401  (a fixture)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Serves tmp_path/www; paths under /broken/ answer 500 and under /forbidden/ answer 403."""
    root = tmp_path / "www"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            for prefix, code in (("/broken/", 500), ("/forbidden/", 403)):
                if self.path.startswith(prefix):
                    self.send_error(code)
                    return
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_remote_manifest_found_and_missing(server: tuple[Path, str]) -> None:
    root, url = server
    (root / "tok").mkdir()
    (root / "tok" / "manifest.json").write_text(json.dumps({"dtype": "uint32", "files": [{"path": "a.npy"}]}))
    assert read_manifest(f"{url}/tok") == {"dtype": "uint32", "files": [{"path": "a.npy"}]}
    (root / "tok" / "a.npy").write_bytes(bytes(8))
    assert token_files([f"{url}/tok/a.npy"], None, None)[0].dtype == "uint32"  # as the data is read
    assert read_manifest(f"{url}/plain") is None  # 404: a directory without a manifest
    assert read_manifest(f"{url}/forbidden") is None  # 403: S3's answer for a missing key, if unlistable


def test_remote_manifest_failures_are_not_missing(server: tuple[Path, str]) -> None:
    _, url = server
    with pytest.raises(
        DataError,
        match=rf"{url}/broken/manifest.json: cannot read the token directory's manifest \(read failed after "
        r"\d+ attempts .*HTTP 500.*check the network and credentials",
    ):
        token_files([f"{url}/broken/a.npy"], None, None)  # before: read as uint16
    closed = "http://127.0.0.1:9/tok"  # the discard port: nothing listens there
    with pytest.raises(DataError, match=r"127.0.0.1:9/tok/manifest.json: cannot read .*connection failed"):
        read_manifest(closed)


def test_s3_manifest_found_and_missing_key(s3_server: str) -> None:  # noqa: F811
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="tokens")
    s3.put_object(Bucket="tokens", Key="a/manifest.json", Body=json.dumps({"dtype": "uint32"}).encode())
    assert read_manifest("s3://tokens/a") == {"dtype": "uint32"}
    assert read_manifest("s3://tokens/b") is None  # NoSuchKey


def test_remote_order_side_file_failure_is_not_missing(server: tuple[Path, str]) -> None:
    from olmo_data.dataset.order import read_order_info

    _, url = server
    assert read_order_info(f"{url}/run/global_indices.npy") is None  # 404: an order OLMo wrote, without one
    with pytest.raises(
        DataError, match=rf"{url}/broken/global_indices.json: read failed after \d+ attempts .*HTTP 500"
    ):
        read_order_info(f"{url}/broken/global_indices.npy")


GOOD_MANIFEST = {
    "format": "olmo-data.tokens",
    "version": 1,
    "dtype": "uint16",
    "eos_token_id": 0,
    "files": [{"path": "part-0.npy", "metadata": "part-0.csv.gz", "tokens": 256, "documents": 3}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "float32"}, r"dtype must be one of \['uint16', 'uint32'\], got 'float32'"),
        ({"version": "1"}, r"version must be an integer, got '1'"),
        ({"eos_token_id": -1}, r"eos_token_id must be a token id \(0 or more\) or null, got -1"),
        ({"sequence_length": 0}, r"sequence_length must be a positive integer, got 0"),
        ({"tokenizer": "gpt2"}, r"tokenizer must be a mapping, got 'gpt2'"),
        ({"files": {"path": "x"}}, r"files must be a list of file entries"),
        ({"files": ["part-0.npy"]}, r"files\[0\] must be a mapping, got 'part-0.npy'"),
        ({"files": [{"path": "../other/part-0.npy"}]}, r"files\[0\].path must be a file name inside the directory"),
        ({"files": [{"path": "/etc/part-0.npy"}]}, r"files\[0\].path must be a file name inside the directory"),
        (
            {"files": [{"path": "a.npy", "tokens": "256"}]},
            r"files\[0\].tokens must be a count \(0 or more\), got '256'",
        ),
        ({"files": [{"path": "a.npy", "tokens": -5}]}, r"files\[0\].tokens must be a count"),
        ({"files": [{"path": "a.npy", "metadata": 7}]}, r"files\[0\].metadata must be a file name inside the"),
    ],
)
def test_manifest_fields_are_checked_by_type_and_value(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    """A damaged manifest field stops at the manifest, by key (a dtype of float32 was a KeyError further on)."""
    from olmo_data.dataset.instances import open_dataset

    (tmp_path / "manifest.json").write_text(json.dumps(GOOD_MANIFEST))
    np_tokens = tmp_path / "part-0.npy"
    np_tokens.write_bytes(bytes(512))
    assert read_manifest(str(tmp_path)) == GOOD_MANIFEST
    (tmp_path / "manifest.json").write_text(json.dumps({**GOOD_MANIFEST, **change}))
    full = rf"manifest.json: {message}.*the directory's manifest is damaged"
    with pytest.raises(DataError, match=full):
        read_manifest(str(tmp_path))
    with pytest.raises(DataError, match=full):
        open_dataset(paths=[str(tmp_path)], sequence_length=64)
