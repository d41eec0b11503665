"""Shared fixtures of the data tests: OLMo 2/3's dolma2 tokenizer, built from cl100k's (the engines' tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import shared_tokenizer

DOLMA2_ADDED = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
    "<|pad|>": 100277,
}


@pytest.fixture(scope="module")
def dolma2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A dolma2-like tokenizer: cl100k's BPE with cl100k's special tokens and a pad, as OLMo 2/3's has."""
    data = json.loads(Path(shared_tokenizer("cl100k_base.json")).read_text())
    data["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        | {"special": True}
        for c, i in DOLMA2_ADDED.items()
    ]
    path = tmp_path_factory.mktemp("dolma2") / "tokenizer.json"
    path.write_text(json.dumps(data))
    return str(path)
