"""notebooks/inspect_data.ipynb runs top to bottom under Jupyter (`jupyter nbconvert --execute`, as a user runs
it, which starts the kernel in notebooks/) on small generated data, and shows the right batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.order import build_config_orders
from olmo_data.run.batches import inspect_batch
from olmo_data.tokenize import TokenizeOptions, tokenize

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "inspect_data.ipynb"


def execute(root: Path, out: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """`jupyter nbconvert --to notebook --execute notebooks/NOTEBOOK` from `root`; the executed cells' outputs."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert", reason="nbconvert is a dev dependency")
    jupyter = Path(sys.executable).parent / "jupyter"
    cmd = [
        str(jupyter),
        "nbconvert",
        "--to",
        "notebook",
        "--execute",
        f"notebooks/{NOTEBOOK}",
        "--output-dir",
        str(out),
    ]
    full_env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline", **env}
    proc = subprocess.run(cmd, cwd=root, env=full_env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    nb = nbformat.read(out / NOTEBOOK, as_version=4)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    return outputs


def stream_text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


@pytest.mark.slow
def test_notebook_executes_with_a_config_from_the_environment(
    tmp_path: Path, demo_corpus: list[str], demo_tokenizer: str
) -> None:
    sources = [tmp_path / "stdlib-a", tmp_path / "stdlib-b"]  # two sources, to plot their shares
    options = TokenizeOptions(tokenizer=demo_tokenizer, max_tokens_per_file=200_000)
    tokenize(demo_corpus[:2], sources[0], options)
    tokenize(demo_corpus[2:], sources[1], options)
    cfg = {
        "seed": 3,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": 4,
        "model": {"max_sequence_length": 256},
        "data": {"paths": [str(p) for p in sources]},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    build_config_orders(cfg)
    env = {
        "OLMO_DATA_CONFIG": str(config),
        "OLMO_DATA_STEP": "5",
        "OLMO_DATA_TOKENIZER": demo_tokenizer,
        "OLMO_DATA_CACHE": str(tmp_path / "cache"),
    }
    outputs = execute(ROOT, tmp_path / "executed", env)
    text = stream_text(outputs)
    expected = inspect_batch(str(config), step=5, doc_index=DocIndex(str(tmp_path / "cache")))
    assert f"batch fingerprint: {expected.batch_fingerprint}" in text
    first_doc = (expected.instances[0].documents or [])[0]
    assert first_doc.id in text  # the documents table names the batch's documents
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots were drawn


@pytest.mark.slow
def test_notebook_finds_the_demo_run_from_the_repository_root(
    tmp_path: Path, demo_corpus: list[str], demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No settings: the kernel starts in notebooks/, the notebook finds the repository root and the run `make demo`
    trained there, whose config names its data relative to the root."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / NOTEBOOK).write_bytes((ROOT / "notebooks" / NOTEBOOK).read_bytes())
    (repo / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(repo)
    tokenize(demo_corpus, "demo_output/tokens", TokenizeOptions(tokenizer=demo_tokenizer))
    cfg = {
        "seed": 5,
        "save_folder": "demo_output/run",
        "global_train_batch_size": 4,
        "model": {"max_sequence_length": 64},
        "data": {"paths": ["demo_output/tokens"]},
    }
    Path("demo_output/run").mkdir(parents=True)
    Path("demo_output/run/config.yaml").write_text(yaml.safe_dump(cfg))
    build_config_orders(cfg)
    env = {"OLMO_DATA_CACHE": str(tmp_path / "cache")}
    for name in ("OLMO_DATA_CONFIG", "OLMO_DATA_STEP", "OLMO_DATA_TOKENIZER"):
        monkeypatch.delenv(name, raising=False)
    text = stream_text(execute(repo, tmp_path / "executed", env))
    expected = inspect_batch("demo_output/run/config.yaml", step=1, doc_index=DocIndex(str(tmp_path / "cache")))
    assert f"config demo_output/run/config.yaml (from {repo})" in text
    assert f"batch fingerprint: {expected.batch_fingerprint}" in text
