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


@pytest.mark.parametrize("fast", [True, False])
def test_compact_output_is_the_same_json_with_or_without_msgspec(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if fast:
        pytest.importorskip("msgspec", reason="the fast extra's JSON writer")
    else:
        monkeypatch.setitem(__import__("sys").modules, "msgspec", None)  # (import fails: the json way)
    np = pytest.importorskip("numpy")
    obj = {"loss": math.inf, "ids": list(range(1000)), "t": "é\u2028", "x": [1.5, -math.nan, 10**30], "n": None}
    compact = dumps(obj, ensure_ascii=False, indent=None)
    assert json.loads(compact) == {**obj, "loss": None, "x": [1.5, None, 10**30]}
    assert ('ids":[0,1,' in compact) == fast  # (msgspec's separators: no spaces)
    odd = {"f": np.float64("inf"), "s": "x\ud800"}  # not msgspec's to write: the json way, as before
    assert json.loads(dumps(odd, ensure_ascii=False, indent=None)) == {"f": None, "s": "x\ud800"}
