"""The token directory's fixed names, apart from `manifest` so that tokenize reads them without importing numpy
and the rest of the data layer (a tenth of a second and more of its start-up)."""

from __future__ import annotations

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
DTYPE_NAMES = ("uint16", "uint32")  # the token dtypes, as `manifest.DTYPES` maps them to numpy's


def smallest_dtype(vocab_size: int) -> str:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"
