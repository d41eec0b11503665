"""`trace --text`, `prepare-tulu` and `contamination` encode on the engine `tokenize` takes (the fastest one whose
start-up self-check equals `tokenizers`), and their ids equal `tokenizers'`: the same documents, tricky texts and
conversations encoded both ways, and the commands' outputs compared with the `hf` backend's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.documents import read_documents
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import data_tokenizer, load_tokenizer
from olmo_data.tokenizer.engines import available
from olmo_data.tokenizer.recorded import FastestEncoder
from tests.conftest import shared_tokenizer

pytestmark = pytest.mark.skipif(
    not (available("riptoken") or available("tiktoken")), reason="no BPE engine installed (riptoken or tiktoken)"
)
TEXTS = [
    "x\n\n    y  z\t\t  w \n  \n" + " " * 49 + "v",
    "text<|endoftext|>more <|padding|> end",
    "q" * 700 + " " + "\n" * 600 + "日本" * 200,
    "Cafe\u0301 naïve 😀 \u00a0\u3000 ٣٤٥",
]


def _spec(name: str, demo_tokenizer: str) -> str:
    return demo_tokenizer if name == "demo" else shared_tokenizer(name)


def _tokens(root: Path, corpus: list[str], spec: str) -> Path:
    dest = root / "tokens"
    if not (dest / "manifest.json").exists():
        tokenize(corpus, dest, TokenizeOptions(tokenizer=spec))
    return dest


@pytest.mark.parametrize("name", ["demo", "gpt-neox-20b.json"])
def test_the_data_tokenizer_encodes_on_the_engine_and_decodes_as_before(
    name: str, demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path
) -> None:
    """What `trace --text` and `--spans` encode with (and `contamination` before its own reload)."""
    spec = _spec(name, demo_tokenizer)
    dest = _tokens(tmp_path, demo_corpus[:1], spec)
    source = SimpleNamespace(files=[SimpleNamespace(path=str(p)) for p in sorted(dest.glob("*.npy"))])
    tok = data_tokenizer(None, source, "--text")  # type: ignore[arg-type]
    hf = load_tokenizer(spec, "hf")
    assert tok.backend == "hf" and isinstance(tok._encode_batch, FastestEncoder)
    assert tok._encode_batch.backend is None  # nothing loaded before the first encode: decoding costs no more
    texts = [d.text for d in read_documents(demo_corpus[0])][:40] + TEXTS
    expected = [e.ids for e in hf.hf.encode_batch_fast(texts, add_special_tokens=False)]
    got = tok.encode_batch(texts)
    assert tok._encode_batch.backend == load_tokenizer(spec).backend != "hf"  # tokenize's own engine
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert a == b, f"document {i} differs: {texts[i][:60]!r}"
        assert tok.decode(b) == hf.hf.decode(a, skip_special_tokens=False)


def _run(root: Path, corpus: list[str], spec: str) -> tuple[str, dict[str, Any]]:
    from olmo_data.dataset.order import build_config_orders

    cfg = {
        "seed": 5,
        "save_folder": str(root / "run"),
        "global_train_batch_size": 16,
        "max_duration": "1ep",
        "model": {"max_sequence_length": 128},
        "data": {"paths": [str(_tokens(root, corpus, spec))]},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    build_config_orders(cfg)
    return str(root / "config.yaml"), cfg


def test_trace_text_encodes_on_the_engine(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trace --text` of a passage of the data finds what `trace --tokens` of its `tokenizers` ids finds, and the
    encoding ran on tokenize's engine."""
    config, _ = _run(tmp_path, demo_corpus[:1], demo_tokenizer)
    import numpy as np

    hf = load_tokenizer(demo_tokenizer, "hf")
    tokens = np.fromfile(sorted((tmp_path / "tokens").glob("*.npy"))[0], dtype=np.uint16)
    for start in range(1000, 2000, 7):  # a passage whose text encodes back to its own tokens
        ids = tokens[start : start + 16].tolist()
        text = hf.decode(ids)
        if hf.encode(text) == ids:
            break
    used: list[str | None] = []
    call = FastestEncoder.__call__

    def spy(self: FastestEncoder, texts: Any) -> list[list[int]]:
        out = call(self, texts)
        used.append(self.backend)
        return out

    monkeypatch.setattr(FastestEncoder, "__call__", spy)
    by_text = CliRunner().invoke(main, ["trace", config, "--text", text, "--json"])
    by_ids = CliRunner().invoke(main, ["trace", config, "--tokens", ",".join(map(str, ids)), "--json"])
    assert by_text.exit_code == 0 and by_ids.exit_code == 0, by_text.output + by_ids.output
    assert used == [load_tokenizer(demo_tokenizer).backend] and used[0] != "hf"
    hits = [json.loads(r.output)["hits"] for r in (by_text, by_ids)]
    assert hits[0] == hits[1] and hits[0]


CONVERSATIONS = [
    {"id": "a", "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": t[::-1]}]}
    for t in [*TEXTS, "Hi  there,\n\n  friend", "<|endoftext|> inside a reply", " leading and trailing  "]
]


@pytest.mark.parametrize("name", ["demo", "gpt-neox-20b.json"])
def test_prepare_tulu_gets_the_engine_and_writes_what_tokenizers_gives(
    name: str, demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import olmo_data.chat.prepare as prepare

    spec = _spec(name, demo_tokenizer)
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    backends: list[str] = []

    def spy(spec: str, backend: Any = "auto") -> Any:
        tok = load_tokenizer(spec, backend)
        backends.append(tok.backend)
        return tok

    monkeypatch.setattr(prepare, "load_tokenizer", spy)
    outputs = []
    for backend in ("auto", "hf"):
        dest = tmp_path / backend
        args = ["prepare-tulu", "-d", str(src), "-t", spec, "--destination", str(dest), "--backend", backend]
        result = CliRunner().invoke(main, [*args, "--sequence-length", "256", "--template", "tulu", "--no-progress"])
        assert result.exit_code == 0, result.output
        outputs.append({p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()})
    assert backends == [load_tokenizer(spec).backend, "hf"] and backends[0] != "hf"
    assert outputs[0] == outputs[1]


def test_contamination_encodes_on_the_engine(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    """`contamination` encodes every instance with `_fast(data_tokenizer(...))`: tokenize's engine, the ids of
    `tokenizers`."""
    from olmo_data.dataset.instances import open_from_config
    from olmo_data.trace.contamination import _fast

    _, cfg = _run(tmp_path, demo_corpus[:1], demo_tokenizer)
    tok = _fast(data_tokenizer(None, open_from_config(cfg), "contamination"))
    assert tok.backend == load_tokenizer(demo_tokenizer).backend != "hf"
    hf = load_tokenizer(demo_tokenizer, "hf")
    texts = [d.text for d in read_documents(demo_corpus[0])][:40] + TEXTS
    assert tok.encode_batch(texts) == [e.ids for e in hf.hf.encode_batch_fast(texts, add_special_tokens=False)]
