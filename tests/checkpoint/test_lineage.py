"""Lineage in trainer_state.json: a chain through stages, a soup, an import and a fine-tune, kept by a resume, and
the tokens of every stage in total (`olmo-train verify --lineage`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from olmo_train import checkpoint as ckpt
from olmo_train.convert import export_hf, import_hf
from tests.checkpoint.test_soup import GBS, SEQ, anneals, tokens, train  # noqa: F401 (a fixture)

STEP_TOKENS = GBS * SEQ


def test_a_chain_through_a_soup_counts_shared_stage1_once(anneals: dict[str, Path]) -> None:  # noqa: F811
    tmp = anneals["tmp"]
    soup = ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], tmp / "chain-soup")
    ft = train(tmp, "chain-ft", tokens(tmp / "ft", 5), load_path=str(soup), reset_trainer_state=True, max_duration=1)
    state = ckpt.read_trainer_state(ft / "step1")
    walked = [(depth, r["source"], r["run_name"], r["step"]) for depth, r in ckpt.lineage.walk(state.lineage)]
    assert walked == [
        (0, "checkpoint", "chain-soup", 0),
        (1, "soup", "anneal-42", 2),
        (2, "checkpoint", "stage1", 3),
        (1, "soup", "anneal-666", 2),
        (2, "checkpoint", "stage1", 3),
    ]
    lines = ckpt.lineage_lines(str(ft / "step1"))
    assert lines[0] == f"lineage: chain-ft at step 1, {STEP_TOKENS:,} tokens seen"
    assert f"    <- soup: anneal-42 step 2, {2 * STEP_TOKENS:,} tokens, weight 0.5" in lines[2]
    # stage 1 (3 steps) once, the two anneals (2 steps each), the fine-tune (1 step); the soup trained nothing
    assert lines[-1].endswith(f": {(3 + 2 + 2 + 1) * STEP_TOKENS:,}")


def test_a_resume_keeps_the_lineage_and_a_continuation_is_not_counted_twice(anneals: dict[str, Path]) -> None:  # noqa: F811
    tmp = anneals["tmp"]
    web = str(tmp / "web" / "part-0.npy")  # stage 1's data: the counters continue (OLMo's plain load_path)
    keys = {"load_path": str(anneals["stage1"]), "max_duration": 5, "run_name": "stage1-more"}
    more = train(tmp, "stage1-more", web, stop_at=4, save_interval=1, **keys)
    train(tmp, "stage1-more", web, **keys)  # resumed from its own step4
    first, last = ckpt.read_trainer_state(more / "step4"), ckpt.read_trainer_state(more / "step5")
    assert first.lineage == last.lineage and first.lineage[0]["step"] == 3
    assert first.lineage[0]["counters"] == "continued"
    assert (last.step, last.tokens_seen) == (5, 5 * STEP_TOKENS)
    assert ckpt.lineage.total_tokens(last.tokens_seen, last.data_fingerprint, last.lineage) == 5 * STEP_TOKENS


def test_a_reset_on_the_same_data_counts_the_parents_tokens_too(anneals: dict[str, Path]) -> None:  # noqa: F811
    """reset_trainer_state on stage 1's own data: the counters restart at 0, so stage 1's tokens are added, though
    the fingerprint matches and the child's count (4 steps) passes the parent's (3): the record says so."""
    tmp = anneals["tmp"]
    web = str(tmp / "web" / "part-0.npy")
    again = train(tmp, "again", web, load_path=str(anneals["stage1"]), reset_trainer_state=True, max_duration=4)
    state = ckpt.read_trainer_state(again / "step4")
    assert state.lineage[0]["counters"] == "restarted" and state.tokens_seen == 4 * STEP_TOKENS
    assert ckpt.lineage.total_tokens(state.tokens_seen, state.data_fingerprint, state.lineage) == 7 * STEP_TOKENS
    assert ckpt.lineage_lines(str(again / "step4"))[-1].endswith(f": {7 * STEP_TOKENS:,}")


def test_a_shared_ancestor_by_its_sharded_and_unsharded_copy_counts_once() -> None:
    """Two anneals, one loaded from stage 1's step3/, the other from its step3-unsharded/: one checkpoint."""

    def rec(resolved: str, run: str, step: int, parents: list[dict[str, Any]], **keys: Any) -> dict[str, Any]:
        return {"source": "checkpoint", "given": resolved, "resolved": resolved, "run_name": run,
                "data_fingerprint": f"fp-{run}", "step": step, "tokens_seen": step * 100, "weight": None,
                "counters": "restarted", "lineage": parents, **keys}  # fmt: skip

    stage1 = [rec("/r/s1/step3", "s1", 3, []), rec("/r/s1/step3-unsharded", "s1", 3, [])]
    soup = [rec(f"/r/{n}/step2", n, 2, [s], source="soup", weight=0.5) for n, s in zip("ab", stage1, strict=True)]
    assert ckpt.lineage.total_tokens(0, "", soup) == (3 + 2 + 2) * 100
    other = [rec("/r/s1/step3", "s1", 3, []), rec("/elsewhere/s1/step3", "s1", 3, [])]  # a rerun elsewhere
    assert ckpt.lineage.total_tokens(0, "", other) == 2 * 3 * 100


@pytest.mark.slow
def test_an_import_names_its_source(anneals: dict[str, Path]) -> None:  # noqa: F811
    tmp = anneals["tmp"]
    hf = export_hf(anneals["a"], tmp / "a-hf")
    imported = import_hf(str(hf), tmp / "a-imported")
    (record,) = ckpt.read_trainer_state(imported).lineage
    assert (record["source"], record["given"], record["resolved"]) == ("import-hf", str(hf), str(hf.resolve()))
    assert record["lineage"] == [] and record["weight"] is None


def nested_lineage(depth: int) -> str:
    """The JSON text of a lineage of `depth` records each nested in the one before (built as text: json.dumps
    itself would overflow the stack)."""
    head = (
        '[{"source": "checkpoint", "given": "x", "resolved": "/x", "run_name": "r", "data_fingerprint": "", '
        '"step": 1, "tokens_seen": 1, "weight": null, "counters": "restarted", "lineage": '
    )
    return head * depth + "[]" + "}]" * depth


@pytest.mark.parametrize("depth", [2000, 100])
def test_a_lineage_nested_thousands_deep_is_one_line_everywhere(
    anneals: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    depth: int,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """2,000 records overflow the JSON parser's stack, 100 the walks': both are refused by file, in every reader."""
    import shutil

    import yaml
    from click.testing import CliRunner

    from olmo_cli.main import main as olmo_data
    from olmo_cli.train_main import main as olmo_train
    from olmo_train.checkpoint import integrity
    from olmo_train.train import main as run

    damaged = tmp_path / "step2-unsharded"
    shutil.copytree(anneals["a"], damaged)
    state = (damaged / ckpt.TRAINER_STATE).read_text()
    data = state.replace('"lineage": [', f'"lineage": {nested_lineage(depth)}, "x": [', 1).encode()
    integrity.Recorder(damaged, integrity.read_checksums(damaged)).finish(ckpt.TRAINER_STATE, data)
    # 2,000 overflow the JSON parser unless the recursion limit was raised in this process (torch may): then the
    # depth bound refuses it, as it refuses 100
    said = ("nested too deeply to read", "the lineage is more than 64 stages deep")
    for args in (["verify", str(damaged)], ["verify", "--lineage", str(damaged)]):
        result = CliRunner().invoke(olmo_train, args)
        assert "Traceback" not in result.output and "RecursionError" not in result.output, result.output
        assert result.exit_code == 2 and any(x in result.output for x in said), result.output
    cfg = yaml.safe_load((damaged / ckpt.CONFIG).read_text())
    cfg.update(load_path=str(damaged), save_folder=str(tmp_path / "next"), max_duration=3)
    (tmp_path / "next.yaml").write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(olmo_data, ["lineage", str(tmp_path / "next.yaml")])
    assert "Traceback" not in result.output and "RecursionError" not in result.output, result.output
    if "nested too deeply" in CliRunner().invoke(olmo_train, ["verify", str(damaged)]).output:
        # the parent's state cannot be read: a note of the stage, as for a parent gone
        assert result.exit_code == 0 and f"{damaged}/trainer_state.json: {said[0]}" in result.output, result.output
    else:  # every record names /x: the walk meets it again (at any depth, a loop is refused first)
        assert result.exit_code == 2 and "/x: the lineage loops back" in result.output, result.output
    capfd.readouterr()
    assert run([str(tmp_path / "next.yaml")]) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and any(x in err for x in said), err
