"""Tokenizer backends behind one small interface.

`load_tokenizer(spec)` takes a `tokenizer.json` path, a `.tiktoken` ranks file, or a Hugging Face hub id, and
returns a `Tokenizer` (`base`), run by HF `tokenizers` (`hf`) or by a BPE engine, quicktok, riptoken or tiktoken
(`engines`), where that gives identical ids (`tiktoken_backend`, with its plan, encoder and cache modules).
`data_tokenizer` finds the one a dataset's manifests record (`recorded`): it decodes with `tokenizers` and encodes on
the engine `load_tokenizer` picks.
"""

from olmo_data.tokenizer.base import BOS_CANDIDATES, EOS_CANDIDATES, PAD_CANDIDATES, Backend, Tokenizer
from olmo_data.tokenizer.load import load_tokenizer
from olmo_data.tokenizer.recorded import data_tokenizer
from olmo_data.tokenizer.tiktoken_backend import load_tiktoken_file, try_tiktoken

__all__ = [
    "BOS_CANDIDATES",
    "EOS_CANDIDATES",
    "PAD_CANDIDATES",
    "Backend",
    "Tokenizer",
    "data_tokenizer",
    "load_tiktoken_file",
    "load_tokenizer",
    "try_tiktoken",
]
