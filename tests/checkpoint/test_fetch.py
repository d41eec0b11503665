"""A checkpoint by URL (`fetch.download`, behind `load_path`, `verify`, `load_model`) against a server that misbehaves
on purpose (`tests/flaky_server.py`): a stall mid-body or a redirect loop fails within the configured timeout with
one line naming the URL, and never leaves a file under its final name that is not the whole, checked file."""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.checkpoint.fetch import cache_entry
from tests.checkpoint.test_checkpoint_safety import SHARD, SINGLE
from tests.convert.test_unshard import save_both
from tests.data.remote.test_remote import s3_server  # noqa: F401  (a fixture)
from tests.flaky_server import Faults, FlakyServer

TIMEOUT_S = 0.3  # seconds of silence before an attempt is given up (the default is 60)
ATTEMPTS = 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """step1/ (sharded) and step1-unsharded/ of a tiny model, saved by the trainer's code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return save_both(tmp_path_factory.mktemp("saved") / "run", tied=False)


@pytest.fixture
def server(saved: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlakyServer]:
    """Both checkpoints on a loopback server; a download cache of this test's own, and remote reads that give up
    after TIMEOUT_S of silence, ATTEMPTS times."""
    for checkpoint in saved:
        shutil.copytree(checkpoint, tmp_path / "www" / checkpoint.name)
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLMO_DATA_REMOTE_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("OLMO_DATA_REMOTE_ATTEMPTS", str(ATTEMPTS))
    monkeypatch.setattr("olmo_data.remote.reader._READER", None)  # the next reader reads the settings above
    with FlakyServer(tmp_path / "www") as s:
        yield s


def verify_cli(target: str) -> tuple[int, str]:
    result = CliRunner().invoke(olmo_train_cli, ["verify", target])
    return result.exit_code, result.stdout


def leftovers(entry: Path, name: str) -> list[str]:
    """What a failed download of `name` left in the cache entry: its final name or a temporary one."""
    return sorted(p.name for p in entry.rglob("*") if p.name == name or p.name.startswith(f".{name}.part-"))


@pytest.mark.parametrize("kind", ["sharded", "unsharded"])
def test_verify_of_a_checkpoint_that_stalls_mid_body_fails_within_the_timeout(
    server: FlakyServer, saved: tuple[Path, Path], kind: str
) -> None:
    checkpoint = saved[0] if kind == "sharded" else saved[1]
    name = SHARD if kind == "sharded" else ckpt.MODEL_FILE
    url = f"{server.url}/{checkpoint.name}"
    server.faults = Faults(stall=name)
    began = time.monotonic()
    code, out = verify_cli(url)
    assert time.monotonic() - began < ATTEMPTS * TIMEOUT_S + 3  # before: waited for as long as the server did
    assert code == 2 and out.count("\n") == 1, out
    assert out.startswith(f"FAILED {url}/{name}: ranged read of bytes 0..") and f"after {ATTEMPTS} attempts" in out
    assert f"(last: no answer for {TIMEOUT_S} s (ReadTimeoutError))" in out, out
    assert server.injected["stall"] == ATTEMPTS
    entry = cache_entry(url)
    assert leftovers(entry, name) == [], "a partial download was left behind"
    assert (entry / ckpt.CHECKSUMS).is_file()  # the files before it arrived whole, under their names
    fetched = dict(server.ranges_by_file)
    server.faults = Faults()  # the server recovers: the rerun fetches what is missing, reuses what is complete
    code, out = verify_cli(url)
    assert code == 0 and out.startswith(f"OK {entry}: {kind} checkpoint of step 1"), out
    assert (
        server.ranges_by_file[f"/{checkpoint.name}/{ckpt.CHECKSUMS}"] == fetched[f"/{checkpoint.name}/{ckpt.CHECKSUMS}"]
    )
    assert (entry / name).read_bytes() == (checkpoint / name).read_bytes()


def test_a_checkpoint_url_that_redirects_in_a_loop_is_named_as_such(
    server: FlakyServer, saved: tuple[Path, Path]
) -> None:
    url = f"{server.url}/{saved[0].name}"
    server.faults = Faults(redirect_loop=SHARD)
    code, out = verify_cli(url)
    assert code == 2 and out.count("\n") == 1, out
    assert out.startswith(f"FAILED {url}/{SHARD}: size failed (too many redirects (5), the last to /"), out
    assert server.injected["redirect"] == 6  # one request, not retried: a loop answers the same way every time
    assert leftovers(cache_entry(url), SHARD) == []
    with pytest.raises(DataError, match=r"distcp: size failed \(too many redirects \(5\)") as e:
        ckpt.localize(url, SINGLE)
    assert "\n" not in str(e.value)


def test_a_missing_checkpoint_url_says_so(server: FlakyServer) -> None:
    with pytest.raises(DataError, match=r"load_path .*/nothing: no trainer_state.json there; give the URL of a"):
        ckpt.localize(f"{server.url}/nothing", SINGLE)


def test_a_checkpoint_on_s3_downloads_checked(
    s3_server: str,  # noqa: F811
    saved: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """s3:// goes through the same reader (boto3, its timeouts and our counted retries), with the same checks."""
    import boto3

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("olmo_data.remote.reader._READER", None)  # a reader (and boto3 client) for this endpoint
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="runs")
    for path in saved[0].rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "runs", f"step1/{path.relative_to(saved[0])}")
    code, out = verify_cli("s3://runs/step1")
    entry = cache_entry("s3://runs/step1")
    assert code == 0 and out.startswith(f"OK {entry}: sharded checkpoint of step 1: 5 files"), out
    for name in ("checksums.json", ".metadata", SHARD, "rng/rank0.pt"):
        assert (entry / name).read_bytes() == (saved[0] / name).read_bytes(), name
    with pytest.raises(DataError, match=r"load_path s3://runs/nothing: no trainer_state.json there"):
        ckpt.localize("s3://runs/nothing", SINGLE)


@pytest.mark.parametrize("name", [ckpt.CHECKSUMS, ckpt.TRAINER_STATE])
def test_a_side_file_announced_at_a_terabyte_is_refused_naming_its_url(
    server: FlakyServer, saved: tuple[Path, Path], name: str
) -> None:
    url = f"{server.url}/{saved[1].name}"
    server.faults = Faults(endless=name)
    began = time.monotonic()
    code, out = verify_cli(url)
    assert code == 2 and out.count("\n") == 1, out
    assert out.startswith(f"FAILED {url}/{name}: download refused (the server announces 1,000,000,000,000 bytes")
    assert time.monotonic() - began < 5 and server.bytes_sent < 64 << 20
    assert leftovers(cache_entry(url), name) == []


@pytest.mark.parametrize("kind", ["sharded", "unsharded"])
def test_a_checkpoint_from_a_server_that_ignores_range_is_fetched_once_and_checked(
    server: FlakyServer, saved: tuple[Path, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 4 KiB: a file of several chunks is streamed from the first answer, not re-read per chunk."""
    import olmo_data.remote

    real = olmo_data.remote.RemoteReader.download
    monkeypatch.setattr(
        olmo_data.remote.RemoteReader, "download", lambda self, u, d, c=0, **k: real(self, u, d, 4096, **k)
    )
    checkpoint = saved[0] if kind == "sharded" else saved[1]
    server.faults = Faults(ignore_range=True)
    code, out = verify_cli(f"{server.url}/{checkpoint.name}")
    assert code == 0 and out.startswith("OK "), out
    size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    assert server.bytes_sent < 2 * size, (server.bytes_sent, size)  # once (checksums.json read twice at most)
