"""Shared fixtures: a small real-text corpus and a BPE tokenizer made offline from the standard library."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmo_data.demo import make_demo_corpus, train_demo_tokenizer

SHARED_TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"


def shared_tokenizer(name: str) -> str:
    """Path of a real tokenizer in ../shared/tokenizers, or skip the test with the reason."""
    path = SHARED_TOKENIZERS / name
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is only beside the project's CI and dev checkouts)")
    return str(path)


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three dolma .jsonl.gz shards of ~150 standard-library modules (real text, ~1.5 MB)."""
    return make_demo_corpus(tmp_path_factory.mktemp("corpus"), num_shards=3, max_files=150)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_corpus: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level BPE tokenizer.json (vocab 2048, `<|endoftext|>`=0, `<|padding|>`=1) trained on demo_corpus."""
    return train_demo_tokenizer(demo_corpus, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=2048)
