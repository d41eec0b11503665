"""Remote reading against real servers on loopback: an HTTP file server and moto's S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from olmo_data.tokenize import TokenizeOptions, tokenize
from tests.data.test_tokenize import read_output
from tests.helpers import docs, write_jsonl


def test_tokenize_over_http_equals_local(http_root: tuple[Path, str], demo_tokenizer: str, tmp_path: Path) -> None:
    root, url = http_root
    write_jsonl(root / "a.jsonl.gz", docs("over the wire", "second document"))
    tokenize([str(root / "a.jsonl.gz")], tmp_path / "local", TokenizeOptions(tokenizer=demo_tokenizer))
    tokenize([f"{url}/a.jsonl.gz"], tmp_path / "remote", TokenizeOptions(tokenizer=demo_tokenizer))
    local, remote = read_output(tmp_path / "local"), read_output(tmp_path / "remote")
    assert [r[3] for r in remote] == [r[3] for r in local] and len(local) == 2
    assert remote[0][1] == f"{url}/a.jsonl.gz"


def test_missing_http_file_names_the_url(http_root: tuple[Path, str], demo_tokenizer: str, tmp_path: Path) -> None:
    from olmo_data.errors import DataError

    _, url = http_root
    with pytest.raises(DataError, match=r"/nope\.jsonl"):
        tokenize([f"{url}/nope.jsonl"], tmp_path / "o", TokenizeOptions(tokenizer=demo_tokenizer))
    assert not (tmp_path / "o").exists()


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is a dev dependency")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    yield endpoint
    server.stop()


def test_tokenize_from_s3_glob(s3_server: str, demo_tokenizer: str, tmp_path: Path) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="corpus")
    for name, texts in {"b.jsonl.gz": ("bee",), "a.jsonl.gz": ("ay", "ay two"), "other.txt": ("x",)}.items():
        local = write_jsonl(tmp_path / name, docs(*texts))
        s3.upload_file(local, "corpus", f"docs/{name}")
    summary = tokenize(["s3://corpus/docs/*.jsonl.gz"], tmp_path / "out", TokenizeOptions(tokenizer=demo_tokenizer))
    got = read_output(tmp_path / "out")
    assert [(g[1], g[2]) for g in got] == [
        ("s3://corpus/docs/a.jsonl.gz", 1),
        ("s3://corpus/docs/a.jsonl.gz", 2),
        ("s3://corpus/docs/b.jsonl.gz", 1),
    ]
    assert summary.documents == 3
