"""Training from remote token files: the batches read ahead in the background, through a server that fails a tenth
of its requests, are the local run's batches (fingerprints and losses); a server that goes down stops the run with
the URL and byte range, and the run resumes from its last checkpoint once the server is back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_train.train import main
from tests.flaky_server import Faults, FlakyServer

SEQ, GBS, STEPS = 16, 8, 6


@pytest.fixture
def www(tmp_path: Path) -> Path:
    """A token directory (two files, a manifest) at tmp_path/www/tok, to be read locally or over HTTP."""
    tok = tmp_path / "www" / "tok"
    tok.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for k, n in enumerate((40, 33)):
        rng.integers(0, 64, n * SEQ).astype(np.uint16).tofile(tok / f"part-{k}.npy")
        entries.append({"path": f"part-{k}.npy", "tokens": n * SEQ})
    manifest = {"format": "olmo-data.tokens", "version": 1, "dtype": "uint16", "files": entries}
    (tok / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "www"


def run(tmp_path: Path, name: str, data_path: str, *args: str, **data: Any) -> tuple[int, list[dict[str, Any]]]:
    cfg = {
        "save_folder": str(tmp_path / name),
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 4,
        "distributed_strategy": "single",
        "save_interval": 2,
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ},
        "data": {"paths": [data_path], **data},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc = main([str(path), *args])
    metrics = tmp_path / name / "metrics.jsonl"
    return rc, [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []


def trained(records: list[dict[str, Any]]) -> list[tuple[int, str, float]]:
    return [(r["step"], r["train/batch_fingerprint"], r["train/loss"]) for r in records]


def test_remote_training_under_failures_equals_local(tmp_path: Path, www: Path) -> None:
    rc, local = run(tmp_path, "local", str(www / "tok"), prefetch_batches=0)  # no read-ahead at all
    assert rc == 0 and len(local) == STEPS
    with FlakyServer(www, Faults(failure_rate=0.1, seed=4)) as server:
        rc, remote = run(tmp_path, "remote", f"{server.url}/tok/", prefetch_batches=3, remote_concurrency=4)
        assert rc == 0 and sum(server.injected.values()) > 0
    assert trained(remote) == trained(local)
    assert remote[-1]["data/remote_retries"] > 0 and "data/remote_retries" not in local[-1]


def test_server_down_stops_the_run_which_resumes_when_it_is_back(
    tmp_path: Path, www: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, local = run(tmp_path, "local", str(www / "tok"))
    # up for the two manifest reads and the first batches (two ranged reads each: one per file), then down
    with FlakyServer(www, Faults(down_after=10)) as server:
        rc, first = run(tmp_path, "remote", f"{server.url}/tok/", prefetch_batches=1)
        err = capsys.readouterr().err
        assert rc == 2, err
        assert f"error: {server.url}/tok/part-" in err and ": ranged read of bytes " in err
        assert "failed after" in err and "HTTP 503" in err
        assert 0 < len(first) < STEPS and trained(first) == trained(local)[: len(first)]
        server.faults = Faults()  # back up
        rc, resumed = run(tmp_path, "remote", f"{server.url}/tok/")
        assert rc == 0
    assert trained(resumed)[-1] == trained(local)[-1]  # resumed from its checkpoint, on to the same end
    assert resumed[0]["step"] <= len(first) + 1


def test_read_ahead_settings_are_checked(tmp_path: Path) -> None:
    from olmo_data.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"'data.prefetch_batches': must be 0 or more, got -1"):
        load_config(None, ["--data.paths=[a.npy]", "--data.prefetch_batches=-1"])
    with pytest.raises(ConfigError, match=r"'data.remote_concurrency': must be positive, got 0"):
        load_config(None, ["--data.paths=[a.npy]", "--data.remote_concurrency=0"])
