"""JSON that other tools can read: Python's `json.dumps` writes an infinite or NaN float as the bare tokens
`Infinity` / `NaN`, which are not JSON (jq, JavaScript's JSON.parse and most parsers refuse the whole document).
A diverged run has an infinite loss, a flat baseline an infinite z-score, so every `--json` output goes through
here: a non-finite number is written as null (documented per command), never as a bare token.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (inf, -inf, nan) replaced by None, in dicts, lists and tuples alike."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if set(map(type, obj)) <= _EXACT:  # a batch's token ids and masks (4M at OLMo 3's size): one pass in C
            return obj
        return [finite(v) for v in obj]
    return obj


_EXACT = {int, bool, str, type(None)}  # types that are never a non-finite number


def dumps(obj: Any, **options: Any) -> str:
    """`json.dumps` of `finite(obj)`, refusing (ValueError) anything non-finite left, e.g. a numpy float."""
    return json.dumps(finite(obj), allow_nan=False, **options)
