"""The wsd schedule (warm-up, stable, decay; OLMo-core's WSD): its exact values at the boundaries, in steps and in
tokens; its keys checked by meaning; and the learning rates a short run logs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from olmo_data.config import ConfigError, SchedulerConfig, load_config
from olmo_train.train import learning_rate, main

PEAK = 4e-4  # not a power of two: the boundary values are exact by construction, not by luck


@pytest.mark.parametrize(
    "cfg",
    [
        SchedulerConfig(name="wsd", t_warmup=10, decay_fraction=0.2, alpha_f=0.1),
        SchedulerConfig(name="wsd", t_warmup=10, t_decay=20, alpha_f=0.1),
    ],
)
@pytest.mark.parametrize("unit", [1, 4096])  # steps; tokens (units: tokens) at 4096 tokens per step
def test_the_shape_at_its_boundaries(cfg: SchedulerConfig, unit: int) -> None:
    if unit > 1:  # the same schedule counted in tokens
        cfg = SchedulerConfig(
            name="wsd",
            units="tokens",
            t_warmup=cfg.t_warmup * unit,
            decay_fraction=cfg.decay_fraction,
            t_decay=cfg.t_decay * unit if cfg.t_decay is not None else None,
            alpha_f=cfg.alpha_f,
        )
    total = 100 * unit

    def lr(step: float) -> float:
        return learning_rate(cfg, PEAK, step * unit, total)

    assert lr(0) == 0.0  # warm-up from warmup_min_lr
    assert lr(5) == pytest.approx(PEAK / 2)
    assert lr(10) == PEAK  # the warm-up's end: the peak, exactly
    assert lr(11) == lr(50) == lr(80) == PEAK  # stable up to and including the decay's start (100 - 20)
    assert lr(81) == pytest.approx(PEAK - (PEAK - 0.1 * PEAK) / 20)  # then a line
    assert lr(90) == pytest.approx((PEAK + 0.1 * PEAK) / 2)
    assert lr(100) == 0.1 * PEAK  # the last step: alpha_f x peak, exactly
    assert lr(130) == 0.1 * PEAK  # past t_max: stays there
    steps = [lr(s) for s in range(81, 101)]
    assert all(a > b for a, b in zip(steps, steps[1:], strict=False))


def test_t_max_shorter_than_the_run_and_the_rounding_of_decay_fraction() -> None:
    cfg = SchedulerConfig(name="wsd", t_warmup=0, t_max=50, decay_fraction=0.1, alpha_f=0.0)
    assert learning_rate(cfg, 1.0, 45, 100) == 1.0 and learning_rate(cfg, 1.0, 50, 100) == 0.0
    assert learning_rate(cfg, 1.0, 80, 100) == 0.0
    # decay_fraction x t_max is rounded as OLMo-core rounds it (Python's round: halves to even), and at least 1
    assert [SchedulerConfig(decay_fraction=f).decay_length(10) for f in (0.25, 0.35, 0.01)] == [2, 4, 1]


BASE = ["--data.paths=[a.npy]", "--max_duration=100"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--scheduler.name=wsd"], r"'scheduler.decay_fraction': scheduler.name=wsd needs the decay's length"),
        (
            ["--scheduler.name=wsd", "--scheduler.decay_fraction=0.1", "--scheduler.t_decay=10"],
            r"'scheduler.t_decay': set together with scheduler.decay_fraction; set one of them",
        ),
        (
            ["--scheduler.decay_fraction=0.1"],
            r"'scheduler.decay_fraction': set, but scheduler.name is 'cosine_with_warmup', which has no decay phase",
        ),
        (["--scheduler.name=constant", "--scheduler.t_decay=5"], r"'scheduler.t_decay': set, but scheduler.name is"),
        (["--scheduler.name=wsd", "--scheduler.decay_fraction=0"], r"'scheduler.decay_fraction': must be in \(0, 1\]"),
        (["--scheduler.name=wsd", "--scheduler.decay_fraction=1.5"], r"must be in \(0, 1\], got 1\.5"),
        (["--scheduler.name=wsd", "--scheduler.t_decay=0"], r"'scheduler.t_decay': must be positive, got 0"),
        (
            ["--scheduler.name=wsd", "--scheduler.t_warmup=30", "--scheduler.decay_fraction=0.8"],
            r"'scheduler.t_warmup': the warm-up \(30\) and the decay \(80\) are longer than the schedule \(100 steps\)",
        ),
        (
            ["--scheduler.name=wsd", "--scheduler.t_warmup=30", "--scheduler.t_decay=30", "--scheduler.t_max=50"],
            r"the warm-up \(30\) and the decay \(30\) are longer than the schedule \(50 steps\)",
        ),
        (["--scheduler.name=wds"], r"'scheduler.name': got 'wds', expected one of .*; did you mean 'wsd'\?"),
    ],
)
def test_bad_wsd_keys_are_refused_by_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, *overrides])


def test_good_wsd_keys_load() -> None:
    cfg = load_config(None, [*BASE, "--scheduler.name=wsd", "--scheduler.t_warmup=20", "--scheduler.t_decay=80"])
    assert cfg.scheduler.t_decay == 80 and cfg.scheduler.decay_fraction is None
    # in tokens the run's length is known only at start: the fit is not checked here
    tokens = ["--scheduler.units=tokens", "--scheduler.decay_fraction=0.9", "--scheduler.t_warmup=10000"]
    assert load_config(None, [*BASE, "--scheduler.name=wsd", *tokens]).scheduler.decay_fraction == 0.9


SEQ, GBS = 16, 4


@pytest.mark.parametrize(
    "scheduler",
    [
        {"name": "wsd", "t_warmup": 2, "t_decay": 4, "alpha_f": 0.1},
        {"name": "wsd", "units": "tokens", "t_warmup": 2 * GBS * SEQ, "decay_fraction": 0.4, "alpha_f": 0.1},
    ],
)
def test_a_run_logs_the_wsd_shape(tmp_path: Path, scheduler: dict[str, object]) -> None:
    tokens = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, 64, 30 * SEQ).astype(np.uint16).tofile(tokens)
    cfg = {
        "save_folder": str(tmp_path / "run"),
        "max_duration": 10,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 4,
        "distributed_strategy": "single",
        "save_interval": None,
        "optimizer": {"learning_rate": 0.01},
        "scheduler": scheduler,
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": SEQ},
        "data": {"paths": [str(tokens)]},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main([str(path)]) == 0
    lrs = [json.loads(x)["optim/lr"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # warm-up over 2 steps, the peak through step 6 (10 - 4: the decay's start), a line down to 0.001 at step 10
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.01, 0.01, 0.01, 0.00775, 0.0055, 0.00325, 0.001], rel=1e-12)
    assert lrs[1] == lrs[5] == 0.01 and lrs[9] == 0.01 * 0.1
