"""notebooks/inspect_data.ipynb runs top to bottom on small generated data and shows the right batch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from olmo_data.inspect import DocIndex, inspect_batch
from olmo_data.order import build_config_orders

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_notebook_executes(
    tmp_path: Path, demo_corpus: list[str], demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from olmo_data.tokenize import TokenizeOptions, tokenize

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
    monkeypatch.setenv("OLMO_DATA_CONFIG", str(config))
    monkeypatch.setenv("OLMO_DATA_STEP", "5")
    monkeypatch.setenv("OLMO_DATA_TOKENIZER", demo_tokenizer)
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    nb = nbformat.read(ROOT / "notebooks" / "inspect_data.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    expected = inspect_batch(str(config), step=5, doc_index=DocIndex(str(tmp_path / "cache")))
    assert f"batch fingerprint: {expected.batch_fingerprint}" in text
    first_doc = (expected.instances[0].documents or [])[0]
    assert first_doc.id in text  # the documents table names the batch's documents
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots were drawn
