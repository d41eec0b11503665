"""Shared fixtures: a small real-text corpus and a BPE tokenizer made offline from the standard library."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from olmo_data.demo import make_demo_corpus, train_demo_tokenizer
from olmo_data.remote import RemoteOptions, RemoteReader

SHARED_TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"


def shared_tokenizer(name: str) -> str:
    """Path of a real tokenizer in ../shared/tokenizers, or skip the test with the reason."""
    path = SHARED_TOKENIZERS / name
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is only beside the project's CI and dev checkouts)")
    return str(path)


OLMO_CORE_INSTALL = (
    "ai2-olmo-core is not installed: pip install -e '.[olmo-core]' (OLMo-core's own loader is the reference)"
)


@pytest.fixture(scope="session")
def core() -> Any:
    """The OLMo-core reference helpers (tests/olmo_core_reference.py), or a skip naming what to install."""
    pytest.importorskip("olmo_core", reason=OLMO_CORE_INSTALL)
    from tests import olmo_core_reference

    return olmo_core_reference


@pytest.fixture(scope="session")
def demo_token_parts(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """Token files of one demo shard, made by `olmo-data tokenize` in ~4,000-token parts (the OLMo-core tests'
    data: many files, as a real run has)."""
    import json

    from olmo_data.tokenize import TokenizeOptions, tokenize

    dest = tmp_path_factory.mktemp("octokens") / "demo"
    tokenize(demo_corpus[:1], dest, TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=4_000))
    manifest = json.loads((dest / "manifest.json").read_text())
    return [str(dest / f["path"]) for f in manifest["files"]]


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three dolma .jsonl.gz shards of ~150 standard-library modules (real text, ~1.5 MB)."""
    return make_demo_corpus(tmp_path_factory.mktemp("corpus"), num_shards=3, max_files=150)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_corpus: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level BPE tokenizer.json (vocab 2048, `<|endoftext|>`=0, `<|padding|>`=1) trained on demo_corpus."""
    return train_demo_tokenizer(demo_corpus, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=2048)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep derived files (document indexes, checked tokenizer plans) out of the user's ~/.cache."""
    previous = os.environ.get("OLMO_DATA_CACHE")
    os.environ["OLMO_DATA_CACHE"] = str(tmp_path_factory.mktemp("olmo-data-cache"))
    yield
    if previous is None:
        os.environ.pop("OLMO_DATA_CACHE", None)
    else:
        os.environ["OLMO_DATA_CACHE"] = previous


@pytest.fixture(autouse=True)
def _remote_sizes_afresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sizes remote files afresh: loopback servers reuse ports and file names from test to test, so
    the on-disk size cache is off (tests/data/remote/test_remote_sizes.py turns it on) and the process's memo
    is cleared."""
    from olmo_data.remote import clear_memo

    monkeypatch.setenv("OLMO_DATA_SIZE_CACHE", "0")
    clear_memo()
    yield
    clear_memo()


@pytest.fixture(autouse=True, scope="session")
def _quick_remote_retries() -> Iterator[None]:
    """Remote reads retry after a few milliseconds instead of seconds (also in the commands and trainers the tests
    start), so that a server that stays down fails a test at once; what is retried stays the same."""
    import olmo_data.remote.reader

    quick = {"BACKOFF_S": "0.002", "MAX_BACKOFF_S": "0.02", "DEADLINE_S": "20"}
    previous = {k: os.environ.get(f"OLMO_DATA_REMOTE_{k}") for k in quick}
    os.environ.update({f"OLMO_DATA_REMOTE_{k}": v for k, v in quick.items()})
    olmo_data.remote.reader._READER = None
    yield
    for k, v in previous.items():
        if v is None:
            os.environ.pop(f"OLMO_DATA_REMOTE_{k}", None)
        else:
            os.environ[f"OLMO_DATA_REMOTE_{k}"] = v
    olmo_data.remote.reader._READER = None


@pytest.fixture
def fresh_reader(monkeypatch: pytest.MonkeyPatch) -> RemoteReader:
    """A process-wide remote reader of its own (empty cache, counters at zero) for one test."""
    reader = RemoteReader(RemoteOptions.from_env())
    monkeypatch.setattr("olmo_data.remote.reader._READER", reader)
    return reader


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A loopback HTTP file server over tmp_path/www: (that directory, its base URL). Stands in for a web or
    object store (remote documents, token files, checkpoints)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
