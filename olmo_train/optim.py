"""AdamW with OLMo's weight-decay grouping, and learning-rate schedules that are pure functions of progress.

The schedule has no state: the learning rate at a step is computed from the step (or the tokens seen), so a
resumed run gets exactly the learning rate the unstopped run had, with nothing extra to checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from olmo_train.config import OptimizerConfig, SchedulerConfig


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
    # foreach=True is the fast multi-tensor path; it also works on FSDP2's DTensor parameters
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.learning_rate,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        foreach=True,
    )


def learning_rate(cfg: SchedulerConfig, max_lr: float, progress: float, total: float) -> float:
    """The learning rate after `progress` steps (or tokens, with units: tokens) of a run of length `total`."""
    t_max = float(cfg.t_max if cfg.t_max is not None else total)
    warmup = float(cfg.t_warmup)
    if cfg.name == "constant":
        return max_lr
    if warmup > 0 and progress < warmup:
        return cfg.warmup_min_lr + (max_lr - cfg.warmup_min_lr) * progress / warmup
    if cfg.name == "constant_with_warmup":
        return max_lr
    min_lr = max_lr * cfg.alpha_f
    frac = min(1.0, max(0.0, (progress - warmup) / max(1.0, t_max - warmup)))
    if cfg.name == "linear_with_warmup":
        return max_lr - (max_lr - min_lr) * frac
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * frac))  # cosine_with_warmup


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
