"""Built-in demo data: a small real-text corpus and a BPE tokenizer, made offline from the Python standard library.

Every Python installation carries its standard library's sources, so a fresh machine with no network can run the
whole pipeline on real text (code, docstrings, comments) without downloading a corpus or a tokenizer.
"""

from __future__ import annotations

import gzip
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmo_data.display import progress_bar
from olmo_data.documents import read_documents
from olmo_data.io import atomic_path

DEMO_SPECIAL_TOKENS = ["<|endoftext|>", "<|padding|>"]  # ids 0 and 1, as in GPT-NeoX-20B / OLMo-1


def stdlib_sources(max_files: int | None = None) -> list[Path]:
    """The standard library's `.py` files, sorted, so that the corpus is the same on every run."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__")
    files = sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts))
    return files[:max_files] if max_files else files


@dataclass
class DemoData:
    """What `make_demo_data` wrote."""

    documents: list[str]
    tokenizer: str
    chat: str


def make_demo_data(
    destination: str | os.PathLike[str],
    *,
    num_shards: int = 4,
    max_files: int | None = None,
    vocab_size: int = 8192,
    progress: bool | None = None,
) -> DemoData:
    """`olmo-data demo-data`: the corpus in `destination/documents`, the tokenizer trained on it and the chat
    data, with one bar over the three passes over the standard library's modules (write, train, chat)."""
    dest = Path(destination)
    with progress_bar(desc="demo-data", unit=" modules", progress=progress) as bar:
        bar.total = 3 * len(stdlib_sources(max_files))
        files = make_demo_corpus(dest / "documents", num_shards=num_shards, max_files=max_files, bar=bar)
        tokenizer = train_demo_tokenizer(files, dest / "tokenizer.json", vocab_size=vocab_size, bar=bar)
        chat = make_demo_chat(dest / "chat" / "tulu.jsonl", max_files=max_files, bar=bar)
    return DemoData(files, tokenizer, chat)


def make_demo_corpus(
    destination: str | os.PathLike[str], *, num_shards: int = 4, max_files: int | None = None, bar: Any = None
) -> list[str]:
    """Write the stdlib corpus as dolma-format `.jsonl.gz` shards (one document per module); return their paths.

    Modules are dealt round-robin to shards. Each document has `id` (the module's path), `text`, `source` and
    `metadata.bytes`. Re-running with the same arguments gives the same documents.
    """
    dest = Path(destination)
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    for i, path in enumerate(stdlib_sources(max_files)):
        if bar is not None:
            bar.update()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(root).as_posix()
        doc = {"id": rel, "text": text, "source": "python-stdlib", "metadata": {"bytes": len(text.encode())}}
        shards[i % num_shards].append(json.dumps(doc))
    out = []
    for k, lines in enumerate(shards):
        final = dest / f"stdlib-{k:04d}.jsonl.gz"
        with atomic_path(final) as tmp, open(tmp, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
                gz.write(("\n".join(lines) + "\n").encode())
        out.append(str(final))
    return out


def make_demo_chat(destination: str | os.PathLike[str], *, max_files: int | None = None, bar: Any = None) -> str:
    """Write Tulu-format chat data made from the standard library (one conversation per module with a docstring:
    the user asks what the module is for, the assistant answers with the docstring's first paragraph) to
    `destination` (JSON lines); return its path. Enough to run `prepare-tulu` and a fine-tune offline."""
    import ast

    root = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for path in stdlib_sources(max_files):
        if bar is not None:
            bar.update()
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        answer = (doc or "").strip().split("\n\n")[0].strip()
        if not answer:
            continue
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        messages = [
            {"role": "user", "content": f"What is the Python module `{module}` for?"},
            {"role": "assistant", "content": answer},
        ]
        rows.append(json.dumps({"id": module, "dataset": "python-stdlib-docstrings", "messages": messages}))
    final = Path(destination)
    with atomic_path(final) as tmp:
        tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(final)


def train_demo_tokenizer(
    files: list[str], destination: str | os.PathLike[str], *, vocab_size: int = 8192, bar: Any = None
) -> str:
    """Train a byte-level BPE tokenizer (GPT-2 style) on the given dolma files; write and return `tokenizer.json`.

    `<|endoftext|>` is id 0 and `<|padding|>` id 1, as in GPT-NeoX-20B, so the demo exercises the same special-id
    handling as real OLMo tokenizers.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=DEMO_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts():  # type: ignore[no-untyped-def]
        for f in files:
            for doc in read_documents(f):
                if bar is not None:
                    bar.update()
                yield doc.text

    tok.train_from_iterator(texts(), trainer=trainer)
    data = json.loads(tok.to_str())
    # tokenizers >= 0.20 writes merges as pairs, which older releases (dolma pins <= 0.19) cannot read; the
    # "left right" string form reads everywhere and is exact for byte-level tokens, which hold no spaces
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    final = Path(destination)
    with atomic_path(final) as tmp:
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return str(final)
