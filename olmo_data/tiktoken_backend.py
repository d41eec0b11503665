"""tiktoken backend: the same ids as HF `tokenizers` for byte-level BPE vocabularies, several times faster.

(Work in progress: `try_tiktoken` returns None, so every tokenizer runs on HF `tokenizers` for now.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from olmo_data.errors import DataError

if TYPE_CHECKING:
    from olmo_data.tokenizer import Tokenizer


def try_tiktoken(tok: Tokenizer, strict: bool = False) -> Tokenizer | None:
    if strict:
        raise DataError(f"{tok.name}: no exact tiktoken equivalent could be built; use --backend hf or auto")
    return None


def load_tiktoken_file(path: str) -> Tokenizer:
    raise DataError(f"{path}: .tiktoken files are not supported yet")
