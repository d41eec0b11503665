"""The instance filter (olmo_data/instance_filter.py) against OLMo's rule.

OLMo's rule is re-implemented here from its published definition (`find_periodic_sequences`: rows of `period`
tokens, a block of rows equal to the row before, widened by the matching tokens of the rows on either side, `times`
whole periods, only from 3 up; `_validate_instance`: drop when some `times >= repetition_max_count`), in plain
Python loops that share nothing with the library's run arithmetic. Where ai2-olmo can be imported (in this process,
or by the interpreter `$OLMO_REFERENCE_PYTHON` names), its own `find_periodic_sequences` is compared too.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from olmo_data.config import config_from_dict
from olmo_data.dataset.instance_filter import Repetition, RepetitionFilter, instance_filter_of
from olmo_data.errors import DataError

Rule = tuple[int, int, int]  # max_period, min_period, max_count


def reference_repetitions(x: list[int], max_period: int, min_period: int = 1) -> list[Repetition]:
    """OLMo's `find_periodic_sequences`, from its definition, one period, row and token at a time."""
    out = []
    for period in range(min_period, min(max_period, len(x) // 3) + 1):
        rows = [x[i : i + period] for i in range(0, len(x), period)]  # the last row may be short (OLMo pads it)

        def same(r: int, c: int, rows: list[list[int]] = rows) -> bool:  # token c of row r equals the row before's
            return 0 < r < len(rows) and c < len(rows[r]) and rows[r][c] == rows[r - 1][c]

        r = 1
        while r < len(rows):
            if not all(same(r, c) for c in range(period)):
                r += 1
                continue
            first = r
            while r + 1 < len(rows) and all(same(r + 1, c) for c in range(period)):
                r += 1
            last = r
            before = 0  # matching tokens at the end of the row before the block
            while before < period and same(first - 1, period - 1 - before):
                before += 1
            after = 0  # matching tokens at the start of the row after the block
            while after < period and same(last + 1, after):
                after += 1
            start, end = (first - 1) * period - before, (last + 1) * period + after
            if (end - start) // period > 2:
                out.append(Repetition(start, end, period, (end - start) // period))
            r = last + 1
    return out


def reference_masked(x: list[int], rule: Rule) -> bool:
    """OLMo's `_validate_instance`, negated: True when the instance is dropped from the loss."""
    max_period, min_period, max_count = rule
    return any(m.times >= max_count for m in reference_repetitions(x, max_period, min_period))


def with_run(
    unit: list[int], copies: float, *, before: int = 7, after: int = 9, length: int | None = None
) -> list[int]:
    """Distinct filler tokens (1000, 1001, ...), then `copies` copies of `unit` (a fraction: a last copy cut short),
    then more filler."""
    n = round(len(unit) * copies)
    body = [unit[i % len(unit)] for i in range(n)]
    x = list(range(1000, 1000 + before)) + body + list(range(2000, 2000 + after))
    if length is not None:
        x += list(range(3000, 3000 + length - len(x)))
    return x


def masked(x: list[int], rule: Rule = (13, 1, 32)) -> bool:
    got = bool(RepetitionFilter(*rule).filtered(np.array(x))[0])
    assert got == reference_masked(x, rule), (x, rule)
    return got


DISTINCT13 = list(range(13))
DISTINCT14 = list(range(14))


def test_period_1_boundary_is_32_copies() -> None:
    # OLMo counts copies, and `times >= repetition_max_count` drops: 32 equal tokens in a row (31 matches) are caught
    assert not masked(with_run([5], 31))
    assert masked(with_run([5], 32))
    assert masked(with_run([5], 33))
    assert [(r.start, r.end, r.period, r.times) for r in RepetitionFilter().repetitions(np.array(with_run([5], 32)))][
        0
    ] == (7, 39, 1, 32)
    # at the edges of the instance
    assert masked([5] * 32 + list(range(100, 140))) and masked(list(range(100, 140)) + [5] * 32)
    assert not masked([5] * 31 + list(range(100, 140))) and not masked(list(range(100, 140)) + [5] * 31)


def test_period_13_caught_and_14_not() -> None:
    assert masked(with_run(DISTINCT13, 32))
    assert not masked(with_run(DISTINCT13, 32 - 1 / 13))  # 31 copies and 12 tokens: 31 whole periods
    assert masked(with_run(DISTINCT13, 40))
    assert not masked(with_run(DISTINCT14, 60))  # period 14 is past repetition_max_period
    assert masked(with_run(DISTINCT14, 32), (14, 1, 32))
    assert not masked(with_run(DISTINCT14, 31), (14, 1, 32))


@pytest.mark.parametrize("before", range(13))
def test_repetition_at_every_phase_of_the_rows(before: int) -> None:
    # OLMo cuts rows of `period` tokens from the instance's start: where a repetition starts within a row must not
    # matter, nor how the instance ends
    for copies, expected in ((32, True), (32 - 1 / 13, False), (31, False)):
        assert masked(with_run(DISTINCT13, copies, before=before, after=0)) is expected
        assert masked(with_run(DISTINCT13, copies, before=before, after=5)) is expected


def test_overlapping_and_adjacent_repetitions_count_apart() -> None:
    # 20 'a's then 20 'ab's: they share an 'a', neither has 32 copies
    assert not masked(with_run([1], 20, after=0) + [2, 1] * 20 + list(range(50, 60)))
    # 20 copies, one other token, 20 copies of the same unit: two runs, not one of 40
    assert not masked(with_run([1, 2, 3], 20, after=0) + [9] + [1, 2, 3] * 20 + list(range(50, 60)))
    # without the break they are one run
    assert masked(with_run([1, 2, 3], 40))
    # a run of one token is also a run of 2, 3, ... tokens: a period below repetition_min_period is caught at its
    # multiples (OLMo's behaviour), with fewer copies
    assert masked(with_run([4], 64), (13, 2, 32))  # 32 copies of [4, 4]
    assert not masked(with_run([4], 63), (13, 2, 32))


def test_small_counts_and_short_instances() -> None:
    # OLMo reports no repetition of fewer than 3 copies, whatever repetition_max_count says
    assert not masked([1, 2, 1, 2, 7, 8], (13, 1, 1))
    assert masked([1, 2, 1, 2, 1, 2], (13, 1, 1))
    assert masked([3, 3, 3], (13, 1, 2)) and not masked([3, 3], (13, 1, 1))
    assert not masked([], (13, 1, 1)) and not masked([1], (13, 1, 1))
    f = RepetitionFilter()
    assert f.filtered(np.zeros((0, 4096), dtype=np.int64)).shape == (0,)
    assert f.filtered(np.zeros((3, 0), dtype=np.int64)).tolist() == [False] * 3


def random_instances(seed: int, n: int) -> tuple[list[list[int]], list[Rule]]:
    """Instances of random length, random tokens from small and large vocabularies, with up to 3 repetitions planted
    (any period up to 15, 1 to 44 copies and a part, any position), and random rules."""
    rng = np.random.default_rng(seed)
    instances, rules = [], []
    for _ in range(n):
        length, vocab = int(rng.integers(1, 300)), int(rng.choice([2, 3, 50, 1000]))
        x = rng.integers(0, vocab, length)
        for _ in range(int(rng.integers(0, 4))):
            p = int(rng.integers(1, 16))
            span = p * int(rng.integers(1, 45)) + int(rng.integers(0, p))
            at = int(rng.integers(0, max(1, length - span + 1)))
            x[at : at + span] = np.resize(rng.integers(0, vocab, p), span)[: len(x[at : at + span])]
        max_period, min_period = sorted(int(v) for v in rng.integers(1, 16, 2))[::-1]
        instances.append(x.tolist())
        rules.append((max_period, min_period, int(rng.integers(1, 40))))
    return instances, rules


def test_vectorised_rule_equals_the_reference_on_random_instances() -> None:
    instances, rules = random_instances(0, 600)
    caught = 0
    for x, rule in zip(instances, rules, strict=True):
        f = RepetitionFilter(*rule)
        expected = reference_masked(x, rule)
        caught += expected
        assert bool(f.filtered(np.array(x, dtype=np.uint16))[0]) == expected, (x, rule)
        assert f.repetitions(np.array(x)) == sorted(
            (m for m in reference_repetitions(x, rule[0], rule[1]) if m.times >= rule[2]),
            key=lambda m: (m.period, m.start),
        )
    assert 50 < caught < 550  # both verdicts are well represented


def test_a_batch_is_judged_row_by_row() -> None:
    # the same rule on a batch as on each instance alone, whatever the other rows hold
    rng = np.random.default_rng(1)
    batch = rng.integers(0, 50_000, (64, 512))
    for row in range(0, 64, 3):
        p = row % 13 + 1
        at = int(rng.integers(0, 90))
        copies = 32 if row % 2 else 31
        batch[row, at : at + p * copies] = np.resize(rng.integers(0, 50_000, p), p * copies)
    f = RepetitionFilter()
    got = f.filtered(batch)
    assert (
        got.tolist()
        == [bool(f.filtered(r)[0]) for r in batch]
        == [reference_masked(r.tolist(), (13, 1, 32)) for r in batch]
    )
    assert got.sum() == 11  # the odd rows among 0, 3, ..., 63: 32 copies
    assert got.tolist() == f.filtered(batch.astype(np.uint32)).tolist() == f.filtered(batch.astype(np.int32)).tolist()


def olmo_verdicts(instances: list[list[int]], rules: list[Rule], tmp_path: Path) -> list[bool] | None:
    """ai2-olmo's own verdicts (find_periodic_sequences + the check of _validate_instance), or None without it."""
    cases = list(zip(instances, rules, strict=True))
    try:
        find = importlib.import_module("olmo.data.util").find_periodic_sequences  # ai2-olmo in this environment
    except ImportError:
        python = os.environ.get("OLMO_REFERENCE_PYTHON")
        if not python:
            return None
        (tmp_path / "cases.json").write_text(json.dumps(cases))
        code = (
            "import json, numpy as np\n"
            "from olmo.data.util import find_periodic_sequences as find\n"
            "print(json.dumps([any(m.times >= c for m in find(np.array(x, dtype=np.int64), max_period=a, "
            "min_period=b)) for x, (a, b, c) in json.load(open('cases.json'))]))\n"
        )
        # outside the repository and without PYTHONPATH: the olmo_data that ai2-olmo ships must not be ours
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return [bool(v) for v in json.loads(done.stdout)]
    return [
        any(m.times >= c for m in find(np.array(x, dtype=np.int64), max_period=a, min_period=b))
        for x, (a, b, c) in cases
    ]


def test_matches_ai2_olmo_where_it_is_installed(tmp_path: Path) -> None:
    instances, rules = random_instances(2, 1000)
    hand = [with_run([5], 31), with_run([5], 32), with_run(DISTINCT13, 32, before=5), with_run(DISTINCT14, 60)]
    instances, rules = instances + hand, rules + [(13, 1, 32)] * len(hand)
    verdicts = olmo_verdicts(instances, rules, tmp_path)
    if verdicts is None:
        pytest.skip("ai2-olmo is not importable here and $OLMO_REFERENCE_PYTHON is not set")
    assert verdicts[-4:] == [False, True, True, False]
    for x, rule, expected in zip(instances, rules, verdicts, strict=True):
        assert bool(RepetitionFilter(*rule).filtered(np.array(x))[0]) == expected, (x, rule)


def test_config_section_is_checked() -> None:
    """The section is read by the one config reader (olmo_data.config), for the trainer and inspect-batch alike."""

    def rule(section: object) -> RepetitionFilter | None:
        raw = {"data": {"paths": ["a"]} | ({} if section is None else {"instance_filter": section})}
        return instance_filter_of(config_from_dict(raw, "c.yaml"))

    assert rule(None) is None
    assert rule({"enabled": False}) is None
    # a run's saved config.yaml writes the defaults of a filter that is off
    off = {"enabled": False, "repetition_max_period": 13, "repetition_min_period": 1, "repetition_max_count": 32}
    assert rule(off) is None
    assert rule({"enabled": True}) == RepetitionFilter(13, 1, 32)
    on = {"enabled": True, "repetition_max_period": 8, "repetition_max_count": 10}
    assert rule(on) == RepetitionFilter(8, 1, 10)
    bad = [
        ([1], "c.yaml: data.instance_filter: expected a mapping of keys"),
        ({"enabled": True, "max_period": 3}, "unknown config key 'data.instance_filter.max_period'; did you mean"),
        ({"enabled": "yes"}, "config key 'data.instance_filter.enabled': got 'yes' (str), expected bool"),
        ({"enabled": True, "repetition_max_count": 0}, "'data.instance_filter.repetition_max_count': must be positive"),
        ({"enabled": True, "repetition_max_period": 2.5}, "'data.instance_filter.repetition_max_period': got 2.5"),
        ({"repetition_max_count": 8}, "repetition_max_count': set, but data.instance_filter.enabled is not"),
        (
            {"enabled": True, "repetition_min_period": 5, "repetition_max_period": 4},
            "'data.instance_filter.repetition_min_period': 5 is above data.instance_filter.repetition_max_period (4)",
        ),
    ]
    for section, message in bad:
        with pytest.raises(DataError) as e:
            rule(section)
        assert message in str(e.value), (section, str(e.value))


# repetitions planted in instances of random tokens (ids < 60), each between tokens 60 and 61: (unit, copies, masked)
PLANTS = [([7], 40, True), ([7], 31, False), ([1, 2, 3], 33, True), ([4, 5, 6, 8], 31, False), ([9, 10], 32, True)]


def planted_tokens(path: Path, seq: int, n: int, planted_at: list[int]) -> None:
    """A headerless uint16 token file of `n` instances of `seq` tokens; the instances `planted_at` hold one of
    PLANTS each, in turn (so some are caught and some only just not)."""
    tokens = np.random.default_rng(0).integers(0, 60, (n, seq))
    for j, i in enumerate(planted_at):
        unit, copies, _ = PLANTS[j % len(PLANTS)]
        span = np.resize(unit, len(unit) * copies)
        at = 1 + j % 3
        tokens[i, at - 1], tokens[i, at : at + len(span)], tokens[i, at + len(span)] = 60, span, 61
    tokens.astype(np.uint16).tofile(path)


def test_inspect_batch_marks_the_masked_instances(tmp_path: Path) -> None:
    import yaml
    from click.testing import CliRunner

    from olmo_cli.main import main
    from olmo_data.dataset.order import build_config_orders
    from olmo_data.run.batches import format_report, inspect_batch

    seq, gbs, n = 128, 4, 24
    planted_tokens(tmp_path / "tokens.npy", seq, n, list(range(0, n, 2)))
    cfg = {
        "seed": 3,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": gbs,
        "model": {"max_sequence_length": seq},
        "data": {"paths": [str(tmp_path / "tokens.npy")], "instance_filter": {"enabled": True}},
    }
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    build_config_orders(str(config))
    total = 0
    for step in range(1, n // gbs + 1):
        report = inspect_batch(str(config), step=step)
        expected = [reference_masked(i.token_ids.tolist(), (13, 1, 32)) for i in report.instances]
        assert [i.masked for i in report.instances] == expected
        assert report.masked_instances == sum(expected)
        assert report.instance_filter == {
            "enabled": True,
            "repetition_max_period": 13,
            "repetition_min_period": 1,
            "repetition_max_count": 32,
        }
        text = format_report(report)
        assert text.count("MASKED (instance filter)") == sum(expected)
        assert f"{sum(expected)} of {gbs} instances shown are masked" in text
        total += sum(expected)
        for inst in report.instances:
            assert (inst.repetition is not None) == inst.masked
    assert total == sum(PLANTS[j % len(PLANTS)][2] for j in range(n // 2)) == 7  # every instance is in a batch

    # one instance of each caught kind, as text and JSON: which tokens repeat, how often
    reports = [inspect_batch(str(config), step=s) for s in range(1, n // gbs + 1)]
    caught = {(i.repetition.period, i.repetition.times): i for r in reports for i in r.instances if i.repetition}
    assert set(caught) == {(1, 40), (3, 33), (2, 32)}
    three = caught[(3, 33)]
    assert three.repetition is not None and three.repetition.end - three.repetition.start == 99
    step_of = next(r.step for r in reports if three in r.instances)
    out = CliRunner().invoke(main, ["inspect-batch", str(config), "--step", str(step_of)])
    assert out.exit_code == 0, out.output
    assert (
        f"    masked: tokens [{three.repetition.start}, {three.repetition.end}) are a 3-token sequence repeated 33 "
        "times: 1 2 3" in out.output
    )
    out = CliRunner().invoke(main, ["inspect-batch", str(config), "--step", str(step_of), "--json"])
    doc = json.loads(out.output)
    row = next(i for i in doc["instances"] if i["instance"] == three.instance)
    assert row["masked"] is True and row["repetition"] == {
        "start": three.repetition.start,
        "end": three.repetition.end,
        "period": 3,
        "times": 33,
    }
    assert doc["masked_instances"] == sum(i["masked"] for i in doc["instances"])

    # with the filter off (or absent) nothing is marked, and the rest of the report is the same
    cfg["data"]["instance_filter"] = {"enabled": False, "repetition_max_count": 32}
    config.write_text(yaml.safe_dump(cfg))
    off = inspect_batch(str(config), step=step_of)
    assert off.masked_instances is None and off.instance_filter is None
    assert all(i.masked is None and i.repetition is None for i in off.instances)
    assert "MASKED" not in format_report(off) and "instance filter" not in format_report(off)
    assert off.batch_fingerprint == next(r for r in reports if r.step == step_of).batch_fingerprint
    cfg["data"]["instance_filter"] = {"enabled": False, "repetition_max_count": 8}
    config.write_text(yaml.safe_dump(cfg))
    out = CliRunner().invoke(main, ["inspect-batch", str(config), "--step", "1"])
    assert out.exit_code != 0
    assert (
        "config key 'data.instance_filter.repetition_max_count': set, but data.instance_filter.enabled is not"
        in out.output
    )
