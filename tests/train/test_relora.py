"""ReLoRA: its config checks, the jagged cosine against a hand-computed table, the adapters (init, gradients, what
trains), merges that leave the model's function unchanged on one process, DDP and FSDP2, the optimizer resets, and
runs of the trainer: checkpoints and resumes across merges, merged weights for export, continue_from, reporting.

Multi-process runs (2 spawned processes on gloo; the regimes script under torchrun) are marked slow; the rest run
in this process."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from olmo_data.config import (
    ConfigError,
    ModelConfig,
    OptimizerConfig,
    ReLoRAConfig,
    SchedulerConfig,
    TrainConfig,
    load_config,
)
from olmo_train.checkpoint import EXACT_FILE
from olmo_train.nn import Transformer, lora
from olmo_train.train import build_optimizer, learning_rate
from olmo_train.train import relora as regime

SEQ, GBS, VOCAB = 16, 4, 64
TINY: dict[str, Any] = {"d_model": 16, "n_heads": 2, "n_layers": 2, "vocab_size": VOCAB, "max_sequence_length": SEQ}
ALL_LINEARS = ("w_q", "w_k", "w_v", "w_out", "w_gate", "w_up", "w_down")


def relora_cfg(**relora: Any) -> TrainConfig:
    return TrainConfig(
        seed=5, model=ModelConfig(**TINY), relora=ReLoRAConfig(**{"rank": 4, "merge_every": 4, **relora})
    )


def adapted_model(cfg: TrainConfig) -> Transformer:
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model)
    lora.add_adapters(model, cfg)
    return model


# --- config -----------------------------------------------------------------------------------------------------

BASE = ["--data.paths=[a.npy]", "--max_duration=40"]
ON = ["--relora.rank=8", "--relora.merge_every=10"]
RESTARTS = ["--scheduler.name=cosine_restarts", "--relora.restart_warmup_steps=5", "--scheduler.t_warmup=5"]


def test_the_issues_regime_loads() -> None:
    cfg = load_config(
        None,
        [*BASE, "--relora.rank=128", "--relora.merge_every=10", "--relora.cycle_length=10"]
        + ["--relora.restart_warmup_steps=5", "--scheduler.name=cosine_restarts", "--scheduler.t_warmup=5"]
        + ["--relora.optimizer_reset=prune", "--relora.prune_fraction=0.9", "--relora.continue_from=runs/x/step5"],
    )
    assert cfg.relora.rank == 128 and cfg.relora.cycle() == 10 and cfg.relora.fraction() == 0.9
    assert load_config(None, BASE).relora.rank is None  # off by default
    assert load_config(None, [*BASE, *ON, "--relora.optimizer_reset=zero"]).relora.fraction() == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--relora.merge_every=10"], r"'relora.merge_every': set, but relora.rank is not"),
        (["--relora.continue_from=x"], r"'relora.continue_from': set, but relora.rank is not"),
        (["--relora.rank=0", "--relora.merge_every=10"], r"'relora.rank': must be positive, got 0"),
        (["--relora.rank=8"], r"'relora.merge_every': required with relora.rank"),
        ([*ON, "--relora.alpha=0"], r"'relora.alpha': must be positive"),
        ([*ON, "--relora.dropout=1"], r"'relora.dropout': must be in \[0, 1\)"),
        ([*ON, "--relora.target=[attention,w_qkv]"], r"'relora.target': unknown linear 'w_qkv'"),
        ([*ON, "--relora.optimizer_reset=half"], r"'relora.optimizer_reset': got 'half', expected one of"),
        ([*ON, "--relora.optimizer_reset=zero", "--relora.prune_fraction=0.5"], r"'relora.prune_fraction': only used"),
        ([*ON, "--relora.prune_fraction=1.5"], r"'relora.prune_fraction': must be in \[0, 1\]"),
        ([*ON, "--relora.continue_from=a", "--load_path=b"], r"'relora.continue_from': load_path is set too"),
        ([*ON, "--scheduler.name=cosine_restarts"], r"'relora.restart_warmup_steps': scheduler.name=cosine_restarts"),
        ([*ON, *RESTARTS, "--max_duration=45"], r"'relora.cycle_length': 10 steps does not divide the run \(45"),
        ([*ON, *RESTARTS, "--relora.restart_warmup_steps=10"], r"'relora.restart_warmup_steps': 10 is not shorter"),
        ([*ON, *RESTARTS, "--scheduler.t_warmup=20"], r"'scheduler.t_warmup': 20 is longer than a cycle \(10 steps"),
        ([*ON, *RESTARTS, "--relora.cycle_length=8"], r"'relora.merge_every': 10 is not a multiple of"),
        ([*ON, *RESTARTS, "--scheduler.units=tokens"], r"'scheduler.units': cosine_restarts counts its cycles"),
        (["--scheduler.name=cosine_restarts"], r"'relora.cycle_length': scheduler.name=cosine_restarts needs"),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, *overrides])


# --- the jagged cosine ------------------------------------------------------------------------------------------

# max_lr 1, floor alpha_f = 0.1, first warm-up 2 steps, cycles of 4 steps, re-warm-up 2 steps, 12 steps.
# envelope env(p) = p/2 for p < 2, else 0.1 + 0.45 * (1 + cos(pi * (p - 2) / 10)); by hand (cos 18° = 0.9510565163,
# cos 36° = 0.8090169944, cos 72° = 0.3090169944, cos 108° = -cos 72°, cos 144° = -cos 36°, cos 162° = -cos 18°):
#   env(3) = 0.1 + 0.45 * 1.9510565163 = 0.9779754323     env(4) = 0.1 + 0.45 * 1.8090169944 = 0.9140576475
#   env(6) = 0.1 + 0.45 * 1.3090169944 = 0.6890576475     env(7) = 0.1 + 0.45 * 1          = 0.55
#   env(8) = 0.1 + 0.45 * 0.6909830056 = 0.4109423525     env(10) = 0.1 + 0.45 * 0.1909830056 = 0.1859423525
#   env(11) = 0.1 + 0.45 * 0.0489434837 = 0.1220245677    env(12) = 0.1
# restarts after steps 4 and 8: steps 5 and 9 ramp to env(6) and env(10): 1/2 of them.
HAND_TABLE = {
    1: 0.5,  # first warm-up
    2: 1.0,
    3: 0.9779754323,
    4: 0.9140576475,  # last step of cycle 1: on the envelope (the merge follows it)
    5: 0.6890576475 / 2,  # restart: halfway up the line to env(6)
    6: 0.6890576475,
    7: 0.55,
    8: 0.4109423525,
    9: 0.1859423525 / 2,
    10: 0.1859423525,
    11: 0.1220245677,
    12: 0.1,
}
TABLE_SCHEDULE = SchedulerConfig(name="cosine_restarts", t_warmup=2, alpha_f=0.1)
TABLE_CYCLES = ReLoRAConfig(cycle_length=4, restart_warmup_steps=2)


def test_cosine_restarts_matches_the_hand_computed_table() -> None:
    for step, expected in HAND_TABLE.items():
        assert learning_rate(TABLE_SCHEDULE, 1.0, step, 12, TABLE_CYCLES) == pytest.approx(expected, abs=1e-9), step
    # between restarts it is the plain cosine_with_warmup
    plain = SchedulerConfig(name="cosine_with_warmup", t_warmup=2, alpha_f=0.1)
    for step in (1, 2, 3, 4, 6, 7, 8, 10, 11, 12):
        assert learning_rate(TABLE_SCHEDULE, 1.0, step, 12, TABLE_CYCLES) == learning_rate(plain, 1.0, step, 12)


# --- adapters -----------------------------------------------------------------------------------------------------


def test_adapters_init_frozen_base_and_full_rank_rest() -> None:
    cfg = relora_cfg(target=["attention", "w_down"])
    model = adapted_model(cfg)
    torch.manual_seed(cfg.seed)
    plain = Transformer(cfg.model)
    for block, plain_block in zip(model.blocks, plain.blocks, strict=True):
        for name in ALL_LINEARS:
            parent = block.attention if hasattr(block.attention, name) else block.mlp
            module = getattr(parent, name)
            base = getattr(plain_block.attention if parent is block.attention else plain_block.mlp, name)
            assert torch.equal(module.weight, base.weight), "the base weights are the full-rank model's of this seed"
            if name in ("w_q", "w_k", "w_v", "w_out", "w_down"):
                assert isinstance(module, lora.LoRALinear)
                assert not module.weight.requires_grad
                bound = 1 / math.sqrt(module.weight.shape[1])  # Kaiming-uniform as nn.Linear: U(-1/sqrt(in), ..)
                assert module.lora_A.abs().max() <= bound and module.lora_A.abs().max() > bound / 2
                assert float(module.lora_A.detach().std()) == pytest.approx(bound / math.sqrt(3), rel=0.3)
                assert torch.count_nonzero(module.lora_B) == 0
                assert float(module.lora_scale) == 32 / 4
            else:
                assert isinstance(module, torch.nn.Linear) and module.weight.requires_grad
    a = [m.lora_A for m in lora.adapters(model)]
    assert len(a) == 2 * 5 and not torch.equal(a[0], a[1]), "each adapter draws its own A"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n in trainable if "lora_" not in n} == {
        "embeddings.weight",
        "lm_head.weight",
        "norm.weight",
        *(f"blocks.{i}.{n}.weight" for i in range(2) for n in ("attention_norm", "mlp_norm", "mlp.w_gate", "mlp.w_up")),
        *(f"blocks.{i}.attention.{n}.weight" for i in range(2) for n in ("q_norm", "k_norm")),
    }
    optimized = {id(p) for g in build_optimizer(model, cfg.optimizer).param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}, "frozen weights have no AdamW state"
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(ids), plain(ids)), "B = 0: the adapted model starts as the full-rank one"


def adapter_grads(model: Transformer, ids: torch.Tensor) -> tuple[list[float], list[float]]:
    logits = model(ids)[:, :-1]
    F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
    mods = lora.adapters(model)
    return [float(m.lora_A.grad.abs().sum()) for m in mods], [float(m.lora_B.grad.abs().sum()) for m in mods]  # type: ignore[union-attr]


def test_adapters_get_gradients_from_the_first_step() -> None:
    cfg = relora_cfg()
    model = adapted_model(cfg)
    optim = build_optimizer(model, OptimizerConfig(learning_rate=1e-2))
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    grad_a, grad_b = adapter_grads(model, ids)
    assert all(g > 0 for g in grad_b), "step 1: every B has a gradient (A is not zero)"
    assert all(g == 0 for g in grad_a), "step 1: A's gradient is B-weighted, and B starts at zero"
    optim.step()
    optim.zero_grad()
    grad_a, grad_b = adapter_grads(model, ids)
    assert all(g > 0 for g in grad_a) and all(g > 0 for g in grad_b), "from step 2 on, both train"
    # the reference implementation's first cycle (its issue 18): A and B both zero, so neither ever gets a gradient
    broken = adapted_model(cfg)
    for m in lora.adapters(broken):
        torch.nn.init.zeros_(m.lora_A)
    grad_a, grad_b = adapter_grads(broken, ids)
    assert all(g == 0 for g in grad_a + grad_b)


def trained_a_little(
    cfg: TrainConfig, model: torch.nn.Module, steps: int = 2, optim: torch.optim.Optimizer | None = None
) -> torch.optim.Optimizer:
    optim = optim or build_optimizer(model, OptimizerConfig(learning_rate=0.05))
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, SEQ), generator=gen)
        logits = model(ids)[:, :-1]
        F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
        optim.step()
        optim.zero_grad()
    return optim


def test_merge_on_one_process_keeps_logits_and_restarts_the_adapters() -> None:
    from olmo_train.distributed import Dist

    cfg = relora_cfg()
    model = adapted_model(cfg)
    optim = trained_a_little(cfg, model)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    before, state = model(ids).detach(), {k: v.clone() for k, v in model.state_dict().items()}
    assert all(torch.count_nonzero(m.lora_B) > 0 for m in lora.adapters(model)), "the adapters learned something"
    relora = regime.ReLoRA(cfg, model, optim, Dist(0, 1, 0, torch.device("cpu")))
    norm = relora.merge(1)
    assert norm > 0
    assert (model(ids) - before).abs().max() < 1e-5
    merged = lora.merge_state(state)
    assert set(merged) == set(Transformer(cfg.model).state_dict()), "merged: a plain model's keys"
    for i, m in enumerate(lora.adapters(model)):
        prefix = next(k[: -len(".lora_A")] for k, v in model.named_parameters() if v is m.lora_A)
        assert torch.equal(m.weight, merged[f"{prefix}.weight"]), "training's merge = the state dict's, bit for bit"
        assert not torch.equal(m.weight, state[f"{prefix}.weight"])
        assert torch.count_nonzero(m.lora_B) == 0
        assert torch.equal(m.lora_A, lora.kaiming_uniform(tuple(m.lora_A.shape), lora.seeded(cfg.seed, 1, i)))


# --- optimizer resets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["prune", "random", "zero", "none"])
def test_each_reset_mode_zeroes_the_stated_fraction_per_tensor(mode: str) -> None:
    from olmo_train.distributed import Dist

    cfg = relora_cfg(optimizer_reset=mode, prune_fraction=0.75 if mode in ("prune", "random") else None)
    model = adapted_model(cfg)
    optim = trained_a_little(cfg, model, steps=3)
    before = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optim.state.items()}
    relora = regime.ReLoRA(cfg, model, optim, Dist(0, 1, 0, torch.device("cpu")))
    zeroed, low, high = relora.reset_optimizer(1)
    expected = {"prune": 0.75, "random": 0.75, "zero": 1.0, "none": 0.0}[mode]
    adapter_params = {id(p) for m in lora.adapters(model) for p in (m.lora_A, m.lora_B)}
    fractions = []
    for p, s in optim.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            old, new = before[id(p)][key], s[key]
            if id(p) not in adapter_params:
                assert torch.equal(old, new), "embeddings, norms and head keep their state"
                continue
            assert torch.count_nonzero(old) == old.numel()
            zero = new == 0
            fractions.append(float(zero.float().mean()))
            assert abs(fractions[-1] - expected) <= 1 / old.numel(), (mode, key, fractions[-1])
            assert torch.equal(new[~zero], old[~zero]), "what is kept is kept as it was"
            assert torch.equal(zero, s["exp_avg"] == 0), "the same entries in both moments"
            if mode == "prune" and key == "exp_avg":  # the first moment's smallest magnitudes went
                assert old[zero].abs().max() <= old[~zero].abs().min()
        assert torch.equal(s["step"], before[id(p)]["step"])
    assert zeroed == pytest.approx(
        sum(fractions[i] * n for i, n in enumerate(sizes(optim, adapter_params))) / sum(sizes(optim, adapter_params))
    )
    assert low == pytest.approx(min(fractions)) and high == pytest.approx(max(fractions))


def sizes(optim: torch.optim.Optimizer, ids: set[int]) -> list[int]:
    return [s[k].numel() for p, s in optim.state.items() if id(p) in ids for k in ("exp_avg", "exp_avg_sq")]


def test_random_reset_is_seeded() -> None:
    moment = torch.rand(40, 5) + 0.1
    first = regime.reset_mask(moment, "random", 0.5, lora.seeded(1, 2, 3))
    assert int(first.sum()) == 100
    assert torch.equal(first, regime.reset_mask(moment, "random", 0.5, lora.seeded(1, 2, 3)))
    assert not torch.equal(first, regime.reset_mask(moment, "random", 0.5, lora.seeded(1, 2, 4)))
    assert torch.equal(regime.reset_mask(moment, "prune", 0.5, lora.seeded(0)), moment <= moment.median())


def test_the_step_after_a_merge_and_a_prune_stays_an_adam_step() -> None:
    """With the moments of a parameter pruned at different entries, a first moment kept where the second was
    zeroed is divided by eps on the next step (A's gradient is zero then: B is zero): A would jump by ~1e5 * lr."""
    from olmo_train.distributed import Dist

    cfg = relora_cfg(prune_fraction=0.9)
    model = adapted_model(cfg)
    optim = trained_a_little(cfg, model, steps=3)
    relora = regime.ReLoRA(cfg, model, optim, Dist(0, 1, 0, torch.device("cpu")))
    relora.merge(1)
    relora.reset_optimizer(1)
    before = [m.lora_A.detach().clone() for m in lora.adapters(model)]
    for group in optim.param_groups:
        group["lr"], group["weight_decay"] = 1e-3, 0.0
    trained_a_little(cfg, model, steps=1, optim=optim)
    moved = max(float((m.lora_A.detach() - a).abs().max()) for m, a in zip(lora.adapters(model), before, strict=True))
    assert 0 < moved <= 10 * 1e-3, f"A moved by {moved / 1e-3:.3g} x lr"


# --- merges and resets on FSDP2 and DDP (2 processes) -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def merge_worker(rank: int, world: int, port: int) -> None:
    """Each strategy on 2 ranks: train 2 steps, merge, reset; checks on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    from olmo_train.distributed import init_distributed, parallelize, shutdown

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(1)
    d = init_distributed()
    try:
        for strategy in ("fsdp", "ddp"):
            cfg = relora_cfg(optimizer_reset="prune", prune_fraction=0.5)
            cfg.distributed_strategy = strategy
            model = parallelize(adapted_model(cfg), cfg, d)
            optim = trained_a_little(cfg, model)
            mods = lora.adapters(model)
            if strategy == "fsdp":  # really sharded: each rank holds part of W, A and B
                assert all(isinstance(p, DTensor) for m in mods for p in (m.weight, m.lora_A, m.lora_B))
                weight = mods[0].weight
                assert isinstance(weight, DTensor) and weight.to_local().shape[0] < weight.shape[0]
            ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
            with torch.no_grad():
                before = model(ids)
            full = StateDictOptions(full_state_dict=True)
            expected = lora.merge_state(get_model_state_dict(model, options=full))
            moments = [
                {k: regime.full_tensor(v).clone() for k, v in optim.state[p].items() if k != "step"}
                for m in mods
                for p in (m.lora_A, m.lora_B)
            ]
            relora = regime.ReLoRA(cfg, model, optim, d)
            relora.merge(1)
            relora.reset_optimizer(1)
            with torch.no_grad():
                after = model(ids)
            assert (after - before).abs().max() < 1e-5, (strategy, float((after - before).abs().max()))
            got = get_model_state_dict(model, options=full)
            for key, value in expected.items():
                assert torch.equal(got[key], value), (strategy, key)  # type: ignore[arg-type]  # one process's bits
            for m in mods:
                assert torch.count_nonzero(regime.full_tensor(m.lora_B)) == 0
            p_index = 0
            for i, m in enumerate(mods):  # the reset on gathered moments: what one process computes
                for j, p in enumerate((m.lora_A, m.lora_B)):
                    old = moments[p_index]
                    drop = regime.reset_mask(old["exp_avg"], "prune", 0.5, lora.seeded(cfg.seed, 1, i, j, 1))
                    for key in old:
                        want = old[key].masked_fill(drop, 0)
                        assert torch.equal(regime.full_tensor(optim.state[p][key]), want), (strategy, i, j, key)
                    p_index += 1
    finally:
        shutdown()


@pytest.mark.slow
def test_merge_keeps_logits_on_fsdp2_and_ddp() -> None:
    torch.multiprocessing.spawn(merge_worker, args=(2, free_port()), nprocs=2)


# --- runs of the trainer (one process, in this one) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tokens") / "tokens.npy"
    np.random.default_rng(0).integers(0, VOCAB, 60 * SEQ).astype(np.uint16).tofile(path)  # 15 batches
    return str(path)


def run_config(folder: Path, tokens: str, **overrides: Any) -> Path:
    """12 steps, merges after steps 4, 8 and 12, restarts of 2 steps: HAND_TABLE's schedule at lr 0.01."""
    cfg: dict[str, Any] = {
        "seed": 5,
        "save_folder": str(folder / "run"),
        "max_duration": 12,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "save_interval": 3,
        "save_interval_unsharded": 6,
        "model": TINY,
        "optimizer": {"learning_rate": 0.01},
        "scheduler": {"name": "cosine_restarts", "t_warmup": 2, "alpha_f": 0.1},
        "relora": {"rank": 4, "merge_every": 4, "restart_warmup_steps": 2},
        "data": {"paths": [tokens]},
    }
    cfg.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(config: Path, *overrides: str) -> list[dict[str, Any]]:
    from olmo_train.train import main

    assert main([str(config), *overrides]) == 0
    lines = (config.parent / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def reference(tokens: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unstopped ReLoRA run: sharded checkpoints at 3, 6, 9, 12; unsharded at 6 (mid-cycle) and 12."""
    folder = tmp_path_factory.mktemp("reference")
    train(run_config(folder, tokens))
    return folder / "run"


def read_metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_follows_the_schedule_and_logs_merges(reference: Path) -> None:
    got = read_metrics(reference)
    assert [r["step"] for r in got] == list(range(1, 13))
    for r in got:
        step = r["step"]
        assert r["optim/lr"] == pytest.approx(0.01 * HAND_TABLE[step], rel=1e-9), step
        assert r["relora/merges"] == step // 4
        assert r["relora/adapter_norm_B"] > 0 and r["relora/adapter_norm_A"] > 0
        merged = step % 4 == 0
        assert ("relora/update_norm" in r) == merged and ("relora/optimizer_zeroed_fraction" in r) == merged
        if merged:  # the default reset: prune 0.9 (exactly, up to one entry per small tensor)
            assert r["relora/update_norm"] > 0
            assert r["relora/optimizer_zeroed_fraction"] == pytest.approx(0.9, abs=0.01)


def test_resume_mid_cycle_and_right_after_a_merge_is_bitwise(reference: Path, tokens: str, tmp_path: Path) -> None:
    config = run_config(tmp_path, tokens)
    train(config, "--stop_at=3")  # mid-cycle
    train(config, "--stop_at=4")  # trains step 4, merges, saves the post-merge state
    got = train(config)  # resumes right after the merge
    check_bitwise(reference, tmp_path / "run", got)
    # an unsharded checkpoint (model.pt merged, relora.pt exact) resumes bitwise as well
    again = run_config(tmp_path / "from-unsharded", tokens, load_path=str(reference / "step6-unsharded"))
    got = train(again)
    assert [r["step"] for r in got] == list(range(7, 13))
    check_bitwise(reference, tmp_path / "from-unsharded" / "run", got)


def check_bitwise(reference: Path, run: Path, got: list[dict[str, Any]]) -> None:
    ref = {r["step"]: r for r in read_metrics(reference)}
    for r in got:
        for key in ("train/loss", "optim/lr", "train/batch_fingerprint", "train/tokens_seen", "relora/adapter_norm_B"):
            assert r[key] == ref[r["step"]][key], (r["step"], key)
    for name in ("model.pt", "relora.pt", "optim.pt"):
        want = torch.load(reference / "step12-unsharded" / name, weights_only=True)
        have = torch.load(run / "step12-unsharded" / name, weights_only=True)
        if name == "optim.pt":  # (a resumed optimizer's betas are a list, not a tuple)
            want, have = want["state"], have["state"]
        assert want.keys() == have.keys()
        for key in want:
            if isinstance(want[key], dict):
                assert all(torch.equal(want[key][k], have[key][k]) for k in want[key]), (name, key)
            else:
                assert torch.equal(want[key], have[key]), (name, key)


def test_checkpoints_export_and_unshard_hold_plain_merged_weights(reference: Path, tmp_path: Path) -> None:
    from olmo_train.convert import read_model_state, unshard

    plain_keys = set(Transformer(ModelConfig(**TINY)).state_dict())
    model_pt = torch.load(reference / "step6-unsharded" / "model.pt", weights_only=True)
    exact = torch.load(reference / "step6-unsharded" / EXACT_FILE, weights_only=True)
    assert set(model_pt) == plain_keys, "model.pt: a plain model's state dict"
    Transformer(ModelConfig(**TINY)).load_state_dict(model_pt)  # loads without adapters (strict)
    assert all(torch.count_nonzero(v) for k, v in exact.items() if k.endswith("lora_B")), "step 6 is mid-cycle"
    assert lora.merge_state({**model_pt, **exact}).keys() == model_pt.keys()
    for key, value in lora.merge_state({**model_pt, **exact}).items():
        assert torch.equal(value, model_pt[key]), key
    assert not torch.equal(model_pt["blocks.0.attention.w_q.weight"], exact["blocks.0.attention.w_q.weight"])
    # the sharded checkpoint of the same step holds the exact state; read as weights it is merged, the same bits
    sharded = read_model_state(reference / "step6")
    assert set(sharded) == plain_keys and all(torch.equal(sharded[k], model_pt[k]) for k in plain_keys)
    # unshard writes what the trainer's unsharded save writes
    unsharded = unshard(reference / "step6", tmp_path / "step6-unsharded")
    for name in ("model.pt", EXACT_FILE):
        want = torch.load(reference / "step6-unsharded" / name, weights_only=True)
        got = torch.load(unsharded / name, weights_only=True)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), name
    assert not (unshard(reference / "step6", tmp_path / "model-only", model_only=True) / EXACT_FILE).exists()


def test_export_hf_of_a_mid_cycle_checkpoint(reference: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from olmo_train.convert import export_hf

    dest = export_hf(reference / "step9", tmp_path / "hf", check=True)  # mid-cycle; --check: same outputs there
    names = [n for f in dest.glob("*.safetensors") for n in load_file(f)]
    assert names and not [n for n in names if "lora" in n]


def hand_loss(weights: dict[str, torch.Tensor], config: Path, step: int) -> float:
    """The mean next-token loss of a plain model with `weights` on the global batch of `step`."""
    from olmo_data.run.batches import inspect_batch

    model = Transformer(ModelConfig(**TINY))
    model.load_state_dict(weights)
    ids = torch.tensor(np.stack([i.token_ids for i in inspect_batch(str(config), step=step).instances]))
    with torch.no_grad():
        logits = model(ids.long())[:, :-1]
    return float(F.cross_entropy(logits.reshape(-1, VOCAB).double(), ids[:, 1:].reshape(-1).long()))


def test_continue_from_loads_weights_not_the_trainer_state(
    tokens: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from olmo_train.convert import read_model_state
    from olmo_train.train import main

    base = run_config(tmp_path / "base", tokens, max_duration=3, relora={}, scheduler={"t_warmup": 1})
    train(base)
    source = tmp_path / "base" / "run" / "step3"
    config = run_config(tmp_path / "relora", tokens, max_duration=4, save_interval=100, save_interval_unsharded=1)
    got = train(config, f"--relora.continue_from={source}", "--stop_at=2")
    err = capfd.readouterr().err
    assert f"starting from the weights of {source} (relora.continue_from)" in err
    assert "ReLoRA: rank 4 adapters (scale 8) on w_q, w_k, w_v, w_out, w_gate, w_up, w_down of 2 blocks" in err
    assert "AdamW state 0.05 MB against 0.13 MB at full rank (40.4%)" in err, err
    assert [r["step"] for r in got] == [1, 2] and got[0]["train/tokens_seen"] == GBS * SEQ
    assert got[0]["train/loss"] == pytest.approx(hand_loss(read_model_state(source), config, 1), rel=1e-6)
    optim = torch.load(tmp_path / "relora" / "run" / "step1-unsharded" / "optim.pt", weights_only=True)
    assert float(optim["state"]["embeddings.weight"]["step"]) == 1, "a new optimizer, not the source's (step 3)"
    # a full-rank checkpoint is not resumed as a ReLoRA run, nor a ReLoRA checkpoint as a full-rank one
    assert main([str(base), "--relora.rank=4", "--relora.merge_every=3", "--max_duration=6"]) == 2
    assert "a full-rank checkpoint, but this run trains ReLoRA adapters; start ReLoRA from its weights" in (
        capfd.readouterr().err
    )
    assert main([str(config), "--relora={}", "--scheduler.name=constant", "--max_duration=6"]) == 2
    assert "a ReLoRA checkpoint (it holds low-rank adapters), but relora.rank is not set" in capfd.readouterr().err
    # ... but its merged weights start a full-rank run (fine-tuning after ReLoRA pre-training)
    relora_ckpt = tmp_path / "relora" / "run" / "step2-unsharded"
    tune = run_config(tmp_path / "tune", tokens, max_duration=1, relora={}, scheduler={"name": "constant"})
    got = train(tune, f"--load_path={relora_ckpt}", "--reset_trainer_state")
    merged = torch.load(relora_ckpt / "model.pt", weights_only=True)
    assert got[0]["train/loss"] == pytest.approx(hand_loss(merged, tune, 1), rel=1e-6)


# --- runs on 2 processes: bitwise resumes across merges (fsdp, ddp), 2 -> 1 process ---------------------------------

# 6 steps, merges after steps 3 and 6; a stop at step 3 saves step 2 (mid-cycle) and step 3 (right after a merge)
SHORT: dict[str, Any] = {
    "max_duration": 6,
    "optimizer": {"learning_rate": 0.002},
    "save_interval": 2,
    "save_interval_unsharded": 6,
    "scheduler": {"name": "cosine_restarts", "t_warmup": 1},
    "relora": {"rank": 4, "merge_every": 3, "restart_warmup_steps": 2},
}


def phases_worker(rank: int, world: int, phases: list[tuple[str, Any]]) -> None:
    """Run the trainer once per phase on this rank (each time a new process group on its own port), and do the
    file operations between runs on rank 0 (the next run's process group waits for rank 0 to join)."""
    import shutil

    from olmo_train.train import main

    torch.set_num_threads(1)
    for kind, args in phases:
        if kind == "copy":  # (source run, destination run, checkpoint to delete from the copy)
            if rank == 0:
                source, dest, drop = args
                shutil.copytree(source, dest, symlinks=True)
                shutil.rmtree(Path(dest) / drop)
            continue
        port, config, overrides = args
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
        os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
        assert main([config, *overrides]) == 0, (config, overrides)


def same_run(reference: Path, run: Path, bitwise: bool) -> None:
    ref, got = read_metrics(reference), read_metrics(run)
    assert [r["step"] for r in got] == list(range(1, 7)), "each step once"
    for a, b in zip(ref, got, strict=True):
        for key in ("train/batch_fingerprint", "train/tokens_seen", "optim/lr", "relora/merges"):
            assert a[key] == b[key], (b["step"], key)
        if bitwise:
            assert a["train/loss"] == b["train/loss"] and a["relora/adapter_norm_B"] == b["relora/adapter_norm_B"]
        else:  # another world size sums in another order
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
    if bitwise:
        for name in ("model.pt", EXACT_FILE):
            want = torch.load(reference / "step6-unsharded" / name, weights_only=True)
            have = torch.load(run / "step6-unsharded" / name, weights_only=True)
            assert all(torch.equal(want[k], have[k]) for k in want), name


@pytest.mark.slow
def test_two_process_resumes_across_merges_are_bitwise(
    tokens: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    phases: list[tuple[str, Any]] = []
    ports = iter(free_port() for _ in range(12))
    folders = {}
    for strategy in ("fsdp", "ddp"):
        config = {
            name: run_config(tmp_path / strategy / name, tokens, distributed_strategy=strategy, **SHORT)
            for name in ("ref", "a", "b", "c")
        }
        folders[strategy] = {name: c.parent / "run" for name, c in config.items()}
        run = folders[strategy]
        phases += [
            ("train", (next(ports), str(config["ref"]), [])),
            ("train", (next(ports), str(config["a"]), ["--stop_at=3"])),
            ("copy", (run["a"], run["b"], "step3")),  # b resumes mid-cycle (step 2)
            ("copy", (run["a"], run["c"], "step2")),  # c: right after the merge, on 1 process (below)
            ("train", (next(ports), str(config["a"]), [])),  # a resumes right after the merge (step 3)
            ("train", (next(ports), str(config["b"]), [])),
        ]
    torch.multiprocessing.spawn(phases_worker, args=(2, phases), nprocs=2)
    for strategy in ("fsdp", "ddp"):
        run = folders[strategy]
        assert (run["b"] / "step2").is_dir() and not (run["b"] / "step3").exists()
        same_run(run["ref"], run["a"], bitwise=True)
        same_run(run["ref"], run["b"], bitwise=True)
    # 2 -> 1 process: the same batches and token counts, the losses up to the order of sums
    from olmo_train.train import main

    one = folders["fsdp"]["c"]
    assert main([str(one.parent / "config.yaml")]) == 0
    assert "the checkpoint was written by 2 ranks; continuing on 1" in capfd.readouterr().err
    same_run(folders["fsdp"]["ref"], one, bitwise=False)


@pytest.mark.slow
def test_the_regimes_script(tmp_path: Path, demo_corpus: list[str], demo_tokenizer: str) -> None:
    """scripts/regimes.sh on demo tokens: DDP, FSDP, then ReLoRA on FSDP from the FSDP run's step 20 (smaller
    batches than the script's default, to keep the test short)."""
    import subprocess
    import sys

    from olmo_data.tokenize import TokenizeOptions, tokenize

    tokenize(demo_corpus[:2], tmp_path / "tokens", TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "DATA": str(tmp_path / "tokens"),
        "OUT": str(tmp_path / "out"),
        "LORA_RANK": "8",
    }
    small = ["--global_train_batch_size=4", "--device_train_microbatch_size=2", "--model.max_sequence_length=64"]
    proc = subprocess.run(
        ["bash", "scripts/regimes.sh", *small], cwd=repo, env=env, text=True, capture_output=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "regimes: OK" in proc.stdout
    merges = [json.loads(x).get("relora/merges") for x in (tmp_path / "out" / "relora" / "metrics.jsonl").open()]
    assert merges[9] == 1 and merges[19] == 2


def test_the_weights_of_an_adapted_checkpoint_load_only_through_the_relora_hooks(tmp_path: Path) -> None:
    """The checkpoint package knows nothing of adapters: loading a ReLoRA run's sharded weights without the hooks
    the trainer passes is refused by name (DCP would read the unmerged base weights alone, silently); with them,
    the model gets the merged weights."""
    from olmo_data.errors import DataError
    from olmo_train import checkpoint as ckpt
    from olmo_train.distributed import Dist

    single = Dist(0, 1, 0, torch.device("cpu"))
    cfg = relora_cfg()
    model = adapted_model(cfg)
    optim = trained_a_little(cfg, model, steps=3)
    path = ckpt.save_sharded(tmp_path, model, optim, ckpt.TrainerState(step=3), -1, single, cfg)
    plain = Transformer(cfg.model)
    with pytest.raises(DataError, match=r"model tensors this model has no place for \(blocks\.0\.attention\."):
        ckpt.load_checkpoint(path, plain, None, single)
    ckpt.load_checkpoint(path, plain, None, single, restore_rng=False, hooks=regime.RELORA_LOAD)
    merged = lora.merge_state(model.state_dict())
    assert any(torch.count_nonzero(m.lora_B) for m in lora.adapters(model))  # the merge changes the weights
    for key, value in plain.state_dict().items():
        assert torch.equal(value, merged[key]), key
