"""AdamW with OLMo's weight-decay grouping, and learning-rate schedules that are pure functions of progress.

wsd (warm-up, stable, decay) is OLMo-core's WSD: linear warm-up over t_warmup (from warmup_min_lr, as every
schedule here), the peak until the decay starts at t_max - decay, then a line to alpha_f x peak at t_max. Unlike
a cosine, the learning rate before the decay does not depend on the run's length: a run can be extended, or a
checkpoint of the stable phase decayed (annealed) in a run of its own.

The schedule has no state: the learning rate at a step is computed from the step (or the tokens seen), so a
resumed run gets exactly the learning rate the unstopped run had, with nothing extra to checkpoint.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from olmo_data.config import OptimizerConfig, ReLoRAConfig, SchedulerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW; norms (and biases) and embeddings are excluded from weight decay unless configured."""
    decay, no_decay = [], []
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_embedding = id(param) in embedding_params
        is_norm_or_bias = param.ndim < 2 or name.endswith(".bias")
        if (is_embedding and not cfg.decay_embeddings) or (is_norm_or_bias and not cfg.decay_norm_and_bias):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # fused: one kernel for all parameters (GPUs: the default there); else foreach, the multi-tensor path. Both work
    # on FSDP2's DTensor parameters.
    params = decay + no_decay
    fused = cfg.fused if cfg.fused is not None else bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.learning_rate,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        foreach=not fused,
        fused=fused,
    )


def learning_rate(
    cfg: SchedulerConfig, max_lr: float, progress: float, total: float, restarts: ReLoRAConfig | None = None
) -> float:
    """The learning rate after `progress` steps (or tokens, with units: tokens) of a run of length `total`.
    `restarts` gives cosine_restarts its cycle length and re-warm-up."""
    if cfg.name == "cosine_restarts":
        return jagged_cosine(cfg, max_lr, progress, total, restarts or ReLoRAConfig())
    t_max = float(cfg.t_max if cfg.t_max is not None else total)
    warmup = float(cfg.t_warmup)
    if cfg.name == "constant":
        return max_lr
    if warmup > 0 and progress < warmup:
        return cfg.warmup_min_lr + (max_lr - cfg.warmup_min_lr) * progress / warmup
    if cfg.name == "constant_with_warmup":
        return max_lr
    min_lr = max_lr * cfg.alpha_f
    if cfg.name == "wsd":
        decay = float(cfg.decay_length(t_max))
        if progress <= t_max - decay:
            return max_lr
        frac = min(1.0, (progress - (t_max - decay)) / decay)
        return max_lr * (1 - frac) + min_lr * frac  # exactly max_lr at the decay's start, min_lr at t_max
    frac = min(1.0, max(0.0, (progress - warmup) / max(1.0, t_max - warmup)))
    if cfg.name == "linear_with_warmup":
        return max_lr - (max_lr - min_lr) * frac
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * frac))  # cosine_with_warmup


def jagged_cosine(cfg: SchedulerConfig, max_lr: float, progress: float, total: float, r: ReLoRAConfig) -> float:
    """ReLoRA's schedule: one cosine envelope over the run (cosine_with_warmup's), cut at every multiple k*c of the
    cycle length c: just after it the rate restarts from zero and rises linearly over the w re-warm-up steps to
    the envelope's value at k*c + w:

        lr(p) = env(k*c + w) * (p - k*c) / w   if k = ceil(p / c) - 1 >= 1 and p - k*c < w;   env(p) otherwise

    Step p trains at lr(p) (step 1 is the first), so the step just after a restart trains at env(k*c + w) / w, the
    step at the restart itself (the last of its cycle, after which the adapters merge) at the envelope, and no step
    at zero. The restart ramp ends at the envelope and never jumps: the ramp is a line to the envelope's value
    where it rejoins it, as in the reference implementation."""
    cycle, warm = r.cycle(), r.restart_warmup_steps
    if not cycle or not warm:
        raise ValueError("cosine_restarts needs relora.cycle_length (or merge_every) and relora.restart_warmup_steps")
    envelope = dataclasses.replace(cfg, name="cosine_with_warmup")
    restart = (math.ceil(progress / cycle) - 1) * cycle  # the last multiple of the cycle before this step
    if restart >= cycle and progress - restart < warm:
        return learning_rate(envelope, max_lr, restart + warm, total) * (progress - restart) / warm
    return learning_rate(envelope, max_lr, progress, total)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
