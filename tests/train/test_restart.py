"""OLMo 2's mid-training as published: OLMo2-7B-stage1.yaml, then OLMo2-7B-stage2-seed42.yaml loading its last
checkpoint (weights and optimizer state, steps and tokens counted afresh, new data, the learning rate falling
linearly to zero), run with size, data and duration overrides only (and load_path pointing at our stage 1 instead
of OLMo's bucket). The stage-2 fixture is the stage-1 fixture with exactly the keys the stage-2 file changes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.config import TrainConfig, load_config
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.convert import unshard
from olmo_train.train import main, restart
from tests.data.config.test_olmo_config import OLMO2_7B_SHAPED, SEQ, TINY

STAGE2_LR = 0.000061499


def stage2_text(load_path: str) -> str:
    """OLMo2-7B-stage2-seed42.yaml's differences from the stage-1 file, applied to the stage-1 fixture."""
    raw = yaml.safe_load(OLMO2_7B_SHAPED)
    raw.update(run_name="OLMo2-7B-stage2-seed42", seed=42, load_path=load_path)
    raw["optimizer"]["learning_rate"] = STAGE2_LR
    raw["scheduler"] = {"name": "linear_with_warmup", "t_warmup": 0, "alpha_f": 0}
    raw.update(restore_dataloader=False, no_pre_train_checkpoint=True, max_duration="50e9T", stop_at=11931)
    return yaml.safe_dump(raw, sort_keys=False)


def tokens(directory: Path, seed: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "part-0.npy"
    np.random.default_rng(seed).integers(2, 256, 24 * SEQ).astype(np.uint32).tofile(path)
    return str(path)


def run(folder: Path, config: Path, *overrides: str) -> list[dict[str, Any]]:
    """One in-process run with the working directory as its save folder (the files set none: OLMo's "./")."""
    folder.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert main([str(config), *overrides]) == 0
    finally:
        os.chdir(cwd)
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


STAGE1_DURATION = [o for o in TINY if not o.startswith(("--max_duration", "--scheduler"))]
STAGE2_STEPS = 5


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Stage 1 (3 steps, with OLMo's pre-train checkpoint: the file leaves no_pre_train_checkpoint out), then
    stage 2 from its sharded checkpoint, and stage 2 again with reset_optimizer_state."""
    tmp = tmp_path_factory.mktemp("stages")
    (tmp / "stage1.yaml").write_text(OLMO2_7B_SHAPED)
    stage1 = tmp / "stage1"
    data1, data2 = tokens(tmp / "web", 0), tokens(tmp / "math", 1)
    run(stage1, tmp / "stage1.yaml", *TINY, f"--data.paths=[{data1}]")
    parent = stage1 / "step3"
    (tmp / "stage2.yaml").write_text(stage2_text(str(parent)))
    overrides = [*STAGE1_DURATION, f"--max_duration={STAGE2_STEPS * 4 * SEQ}T", f"--data.paths=[{data2}]"]
    anneal = run(tmp / "stage2", tmp / "stage2.yaml", *overrides)
    fresh_optim = run(tmp / "stage2-reset", tmp / "stage2.yaml", *overrides, "--reset_optimizer_state=true")
    return {"tmp": tmp, "parent": parent, "anneal": anneal, "fresh_optim": fresh_optim, "overrides": overrides}


def losses(records: list[dict[str, Any]]) -> list[float]:
    return [r["train/loss"] for r in records if "train/loss" in r]


@pytest.mark.slow
def test_stage2_counts_from_1_decays_to_zero_and_keeps_stage1s_optimizer(stages: dict[str, Any]) -> None:
    anneal = [r for r in stages["anneal"] if "train/loss" in r]
    assert [r["step"] for r in anneal] == list(range(1, STAGE2_STEPS + 1))
    assert [r["train/tokens_seen"] for r in anneal] == [s * 4 * SEQ for s in range(1, STAGE2_STEPS + 1)]
    lrs = [r["optim/lr"] for r in anneal]
    # linear from the file's value (at step 0) to alpha_f x it = 0 at the last step
    assert lrs == pytest.approx([STAGE2_LR * (1 - s / STAGE2_STEPS) for s in range(1, STAGE2_STEPS + 1)], abs=1e-15)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12) and np.allclose(np.diff(lrs), -STAGE2_LR / STAGE2_STEPS)
    reset = losses(stages["fresh_optim"])
    ours = losses(stages["anneal"])
    assert ours[0] == reset[0], "step 1 trains on stage 1's weights and the same batch either way"
    assert ours[1] != reset[1], "step 2 follows an update made with stage 1's optimizer state"
    run2 = stages["tmp"] / "stage2"
    saved = yaml.safe_load((run2 / "config.yaml").read_text())
    assert saved["load_path"] == str(stages["parent"]) and saved["restore_dataloader"] is False
    state = ckpt.read_trainer_state(run2 / f"step{STAGE2_STEPS}")
    (parent,) = state.lineage
    stage1_state = ckpt.read_trainer_state(stages["parent"])
    assert parent["resolved"] == str(stages["parent"].resolve()) and parent["source"] == "checkpoint"
    assert (parent["run_name"], parent["step"], parent["tokens_seen"]) == ("OLMo2-7B-stage1", 3, 3 * 4 * SEQ)
    assert parent["data_fingerprint"] == stage1_state.data_fingerprint != state.data_fingerprint
    assert parent["lineage"] == [] and state.run_name == "OLMo2-7B-stage2-seed42"
    lines = ckpt.lineage_lines(str(run2 / f"step{STAGE2_STEPS}"))
    assert lines[-1].endswith(f"{(3 + STAGE2_STEPS) * 4 * SEQ:,}"), lines


@pytest.mark.slow
def test_stage2_loads_from_unsharded_and_by_url(stages: dict[str, Any], http_root: tuple[Path, str]) -> None:
    """The same stage-2 step 1 and 2 from the parent unsharded, and from a copy served over HTTP."""
    tmp, parent = stages["tmp"], stages["parent"]
    flat = unshard(parent, tmp / "stage1-step3-unsharded")
    from_flat = run(tmp / "from-flat", tmp / "stage2.yaml", *stages["overrides"], f"--load_path={flat}")
    assert losses(from_flat)[:2] == pytest.approx(losses(stages["anneal"])[:2], rel=1e-6)
    root, url = http_root
    shutil.copytree(flat, root / "step3-unsharded")
    from_url = run(tmp / "from-url", tmp / "stage2.yaml", *stages["overrides"], f"--load_path={url}/step3-unsharded")
    assert losses(from_url)[:2] == pytest.approx(losses(stages["anneal"])[:2], rel=1e-6)
    (record,) = ckpt.read_trainer_state(tmp / "from-url" / f"step{STAGE2_STEPS}").lineage
    assert record["resolved"] == f"{url}/step3-unsharded" and record["given"] == f"{url}/step3-unsharded"


def cfg(**keys: Any) -> TrainConfig:
    return TrainConfig(load_path="x", **keys)


def test_the_restart_table() -> None:
    """OLMo's meanings (scripts/train.py, Trainer.load_trainer_state_dict), and this trainer's older spelling."""
    P = restart.RestartPlan
    assert restart.plan(cfg()) == P(optimizer=True, counters=True, rng=True, bolt_on_warmup=False)
    assert restart.plan(cfg(restore_dataloader=False)) == P(True, False, True, False)
    assert restart.plan(cfg(reset_optimizer_state=True)) == P(False, True, True, True)
    assert restart.plan(cfg(reset_trainer_state=True, reset_optimizer_state=False)) == P(True, False, False, False)
    assert restart.plan(cfg(reset_trainer_state=True, reset_optimizer_state=True)) == P(False, False, False, False)
    # reset_trainer_state alone, as before these keys: weights only
    assert restart.plan(cfg(reset_trainer_state=True)) == P(False, False, False, False)


def test_olmo_form_keeps_the_optimizer_under_reset_trainer_state(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(stage2_text("ckpt").replace("restore_dataloader: false", "reset_trainer_state: true"))
    loaded = load_config(path, require_data=False)
    assert loaded.reset_optimizer_state is False and restart.plan(loaded).optimizer
    assert loaded.no_pre_train_checkpoint is True and loaded.restore_dataloader is True
    path.write_text(OLMO2_7B_SHAPED)
    assert load_config(path, require_data=False).no_pre_train_checkpoint is False  # OLMo's default


def olmo_bolt_on(inner: Any, warmup_start: int, warmup_end: int, step: int) -> float:
    """olmo/optim.py BoltOnWarmupScheduler.get_lr, as published."""
    if step < warmup_start:
        return 0.0
    if step < warmup_end:
        return float(inner(warmup_end) * (step - warmup_start) / (warmup_end - warmup_start))
    return float(inner(step))


def test_bolt_on_warmup_is_olmos() -> None:
    c = cfg(reset_optimizer_state=True)
    c.scheduler.name, c.scheduler.t_warmup, c.scheduler.alpha_f = "cosine_with_warmup", 4, 0.1
    total = 100.0

    def inner(p: float) -> float:
        from olmo_train.train import learning_rate

        return learning_rate(c.scheduler, c.optimizer.learning_rate, p, total)

    for step in range(31, 40):
        ours = restart.bolt_on_learning_rate(c, inner(step), 30, step, 1, total)
        assert ours == pytest.approx(olmo_bolt_on(inner, 30, 34, step))
    state = ckpt.TrainerState(step=35, lineage=[{"step": 30}])
    assert restart.bolt_on_start(c, state) == 30  # from the lineage: a resume mid-warm-up keeps it
    c.restore_dataloader = False
    assert restart.bolt_on_start(c, state) == 0


def test_lineage_shape_is_checked_by_key(tmp_path: Path) -> None:
    good = {
        "source": "checkpoint",
        "given": "a",
        "resolved": "/a",
        "run_name": "r",
        "data_fingerprint": "f",
        "step": 1,
        "tokens_seen": 2,
        "weight": None,
        "lineage": [],
    }
    ckpt.TrainerState.parse(json.dumps({"lineage": [good]}).encode(), tmp_path)
    ckpt.TrainerState.parse(json.dumps({"lineage": [{**good, "counters": "continued"}]}).encode(), tmp_path)
    bad: list[tuple[Any, str]] = [
        ("x", r"lineage must be a list of parent records, got 'x'"),
        ([{**good, "step": "1"}], r"lineage\[0\]\.step must be an integer of 0 or more, got '1'"),
        ([{**good, "lineage": [{**good, "source": "git"}]}], r"lineage\[0\]\.lineage\[0\]\.source must be one of"),
        ([{k: v for k, v in good.items() if k != "resolved"}], r"lineage\[0\] has no 'resolved'"),
        ([{**good, "weight": "half"}], r"lineage\[0\]\.weight must be a number or null"),
        ([{**good, "counters": "maybe"}], r"lineage\[0\]\.counters must be \"continued\", \"restarted\" or absent"),
    ]
    for value, match in bad:
        with pytest.raises(DataError, match=match):
            ckpt.TrainerState.parse(json.dumps({"lineage": value}).encode(), tmp_path)


@pytest.mark.slow
def test_stage2_on_one_process_from_a_stage1_of_two(stages: dict[str, Any]) -> None:
    """Stage 1 saved by 2 FSDP ranks (torchrun), stage 2 on one: the optimizer state is resharded, not dropped."""
    import subprocess
    import sys

    tmp = stages["tmp"]
    two = tmp / "stage1-two-ranks"
    two.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "olmo_train"]
    cmd += [str(tmp / "stage1.yaml"), *TINY, f"--data.paths=[{tmp / 'web' / 'part-0.npy'}]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(cmd, cwd=two, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ckpt.read_trainer_state(two / "step3").world_size == 2
    again = [*stages["overrides"], f"--load_path={two / 'step3'}"]
    kept = losses(run(tmp / "from-two", tmp / "stage2.yaml", *again))
    reset = losses(run(tmp / "from-two-reset", tmp / "stage2.yaml", *again, "--reset_optimizer_state=true"))
    assert kept[0] == reset[0] and kept[1] != reset[1]


def test_olmos_pre_train_checkpoint_changes_nothing_in_training(
    stages: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage-1 file leaves no_pre_train_checkpoint out: OLMo's default saves (and here checks) a step-0
    checkpoint first; the run then trains exactly as without it."""
    tmp = stages["tmp"]
    data = f"--data.paths=[{tmp / 'web' / 'part-0.npy'}]"
    capsys.readouterr()
    with_step0 = losses(run(tmp / "pre-train", tmp / "stage1.yaml", *TINY, data, "--save_num_checkpoints_to_keep=-1"))
    assert "pre-train checkpoint step0 saved and checked" in capsys.readouterr().err
    assert ckpt.read_trainer_state(tmp / "pre-train" / "step0").step == 0
    without = losses(run(tmp / "no-pre-train", tmp / "stage1.yaml", *TINY, data, "--no_pre_train_checkpoint=true"))
    assert "pre-train checkpoint" not in capsys.readouterr().err and not (tmp / "no-pre-train" / "step0").exists()
    assert with_step0 == without and len(without) == 3
