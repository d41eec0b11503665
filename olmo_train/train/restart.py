"""Starting a run from another run's checkpoint (`load_path`), with OLMo's four restart keys and their meanings.

OLMo (olmo/train.py, scripts/train.py) restores from load_path the weights always, then:
  - the optimizer state unless `reset_optimizer_state`;
  - the trainer state (step, token and instance counters, data position, RNG) unless `reset_trainer_state`;
  - with `restore_dataloader: false`, the counters and the data position start again from zero (a new stage on
    new data: OLMo 2's stage 2), while the optimizer state and the RNG are still restored;
  - with `reset_optimizer_state` and not `reset_trainer_state`, a "bolt-on" warm-up: the learning rate rises
    linearly from 0 at the loaded step to the schedule's value t_warmup later, and follows the schedule after;
  - `no_pre_train_checkpoint: false`: a run started from nothing saves a step-0 checkpoint and checks it loads.

This trainer's own spelling from before these keys, `reset_trainer_state` alone, loaded the weights only; it keeps
that meaning: `reset_optimizer_state` unset (None) follows `reset_trainer_state`. An OLMo YAML always sets
`reset_optimizer_state` (OLMo's default is false), so there `reset_trainer_state` keeps the optimizer, as in OLMo.
A run that resumes from its own save folder ignores all of this: it continues exactly where it stopped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from olmo_data.config import TrainConfig
from olmo_train import checkpoint as ckpt
from olmo_train.distributed import Dist
from olmo_train.train.optim import learning_rate

log = logging.getLogger("olmo_train")


@dataclass(frozen=True)
class RestartPlan:
    """What a start from load_path takes from the checkpoint besides the weights."""

    optimizer: bool  # the optimizer state (AdamW's moments and step counts)
    counters: bool  # step, epoch, tokens and instances seen: hence the data position and the schedule's position
    rng: bool  # each rank's RNG state
    bolt_on_warmup: bool  # a fresh optimizer in a continuing run: the learning rate warms up again (OLMo)

    def describe(self) -> str:
        kept = ["weights"]
        kept += ["optimizer state"] if self.optimizer else []
        kept += ["step, tokens and data position"] if self.counters else []
        kept += ["RNG"] if self.rng else []
        return ", ".join(kept)


def plan(cfg: TrainConfig) -> RestartPlan:
    """The restart keys of `cfg`, resolved into what is restored (the table in docs/training.md)."""
    reset_optim = cfg.reset_optimizer_state if cfg.reset_optimizer_state is not None else cfg.reset_trainer_state
    counters = not cfg.reset_trainer_state and cfg.restore_dataloader
    return RestartPlan(
        optimizer=not reset_optim,
        counters=counters,
        rng=not cfg.reset_trainer_state,
        bolt_on_warmup=reset_optim and not cfg.reset_trainer_state,
    )


def start_from(
    cfg: TrainConfig,
    path: Path,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    fresh: ckpt.TrainerState,
    d: Dist,
    hooks: ckpt.LoadHooks,
) -> tuple[ckpt.TrainerState, bool]:
    """Load what `plan(cfg)` restores from `path` (load_path made local); returns the run's state and whether
    its counters continue the checkpoint's (then the caller checks the data settings match, as for a resume).
    Either way the state records the parent in its lineage, and the optimizer's hyperparameters are the
    config's, not the checkpoint's (OLMo resets them too)."""
    p = plan(cfg)
    parent = ckpt.read_trainer_state(path)
    if p.counters:
        log.info("continuing from load_path %s: restoring %s (%s)", path, p.describe(), _keys(cfg))
    else:
        why = "reset_trainer_state" if cfg.reset_trainer_state else "restore_dataloader: false"
        log.info("loading %s from %s (%s): a fresh run, first trained step 1", p.describe(), path, why)
    optimizer = optim if p.optimizer else None
    loaded = ckpt.load_checkpoint(path, model, optimizer, d, restore_rng=p.rng, hooks=hooks, model_config=cfg.model)
    given = str(cfg.load_path)
    record = ckpt.lineage.parent_record("checkpoint", given, given, path, parent, continued=p.counters)
    if p.counters:
        state = loaded
        state.wandb_run_id = None  # a new run, though it continues the counters
    else:
        state = fresh
    state.lineage = [record]
    state.run_name = cfg.run_name
    for group in optim.param_groups:  # weight decay as configured (the lr is set every step anyway)
        if group.get("weight_decay", 0.0) > 0.0:
            group["weight_decay"] = cfg.optimizer.weight_decay
    return state, p.counters


def _keys(cfg: TrainConfig) -> str:
    return (
        f"reset_trainer_state={cfg.reset_trainer_state}, reset_optimizer_state={cfg.reset_optimizer_state}, "
        f"restore_dataloader={cfg.restore_dataloader}"
    )


def bolt_on_start(cfg: TrainConfig, state: ckpt.TrainerState) -> int | None:
    """The step a bolt-on warm-up starts from (the step the run was loaded at), or None when there is none. It
    comes from the config and the lineage, so a run resumed from its own checkpoint mid-warm-up keeps it."""
    if not cfg.load_path or not plan(cfg).bolt_on_warmup or not state.lineage or cfg.scheduler.t_warmup <= 0:
        return None
    return int(state.lineage[0]["step"]) if cfg.restore_dataloader else 0


def bolt_on_learning_rate(
    cfg: TrainConfig, lr: float, start_step: int, step: int, tokens_per_step: int, total: float
) -> float:
    """OLMo's BoltOnWarmupScheduler over the schedule's `lr` at `step`: 0 at `start_step`, rising linearly to the
    schedule's value t_warmup later (in the schedule's units), where it rejoins the schedule."""
    unit = 1 if cfg.scheduler.units == "steps" else tokens_per_step
    start, progress = start_step * unit, step * unit
    end = start + cfg.scheduler.t_warmup
    if progress >= end:
        return lr
    at_end = learning_rate(cfg.scheduler, cfg.optimizer.learning_rate, end, total, cfg.relora)
    return at_end * (progress - start) / (end - start)


def pre_train_checkpoint_wanted(cfg: TrainConfig, state: ckpt.TrainerState) -> bool:
    """OLMo saves a checkpoint before the first step of a run that starts from nothing, to find out at once that
    saving (and loading) works; `no_pre_train_checkpoint` turns it off (this trainer's default)."""
    return not cfg.no_pre_train_checkpoint and not cfg.load_path and state.step == 0


def after_pre_train_save(path: Path | None, optim: torch.optim.Optimizer) -> None:
    """Check the step-0 checkpoint's files as a load would, then clear the optimizer state that saving it created
    (a state dict of an untouched AdamW is made by a zero step), so the run trains as if it had not saved."""
    if path is not None:
        ckpt.check_files(path)
        log.info("pre-train checkpoint %s saved and checked", path)
    optim.state.clear()
    optim.zero_grad(set_to_none=True)
