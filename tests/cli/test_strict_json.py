"""`--json` output is JSON any parser reads: a non-finite float anywhere (a diverged loss, an infinite z-score)
becomes null, including inside the long lists of ints a batch carries, which are passed through in one pass."""

from __future__ import annotations

import json
import math

import pytest

from cli.strict_json import dumps, finite


def test_non_finite_numbers_become_null_at_any_depth() -> None:
    obj = {"loss": math.inf, "rows": [[1, 2, math.nan], (3, -math.inf, True)], "ids": list(range(5)), "s": ["a"]}
    assert json.loads(dumps(obj)) == {
        "loss": None,
        "rows": [[1, 2, None], [3, None, True]],
        "ids": [0, 1, 2, 3, 4],
        "s": ["a"],
    }


def test_a_list_of_ints_is_passed_through_and_one_float_is_still_seen() -> None:
    ids = list(range(100_000))
    assert finite(ids) is ids
    assert finite([*ids, math.nan])[-1] is None


def test_a_numpy_float64_among_ints_is_seen() -> None:
    np = pytest.importorskip("numpy")
    assert json.loads(dumps({"x": [1, 2, np.float64("inf")]})) == {"x": [1, 2, None]}
