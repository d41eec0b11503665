"""ReLoRA: low-rank adapters (`olmo_train.nn.lora`) on the block linears, merged into the frozen weights every
`merge_every` steps and restarted, with a partial reset of the adapters' optimizer state at each merge; and what
loading a checkpoint into or out of such a run needs (`ReLoRALoad`).

Merges and optimizer resets work on whole tensors: a sharded (FSDP2) parameter or moment is gathered, changed by
the same arithmetic as on one process, and each rank keeps its shard of the result. The merged weight is then
exactly what one process computes from the same W, A and B, and a state dict merged outside training (export,
unshard) gets the bits a merge in training would give on the same kind of device.

A checkpoint holds the exact training state (the unmerged W, A and B), so a run resumes bitwise. Whatever reads
a checkpoint's weights outside the trainer gets them merged: `convert.read_model_state` (export-hf, generate)
merges a sharded checkpoint's adapters, and an unsharded checkpoint's `model.pt` holds the merged plain weights
(loads into a model without adapters) while `relora.pt` beside it keeps the unmerged W, A and B that a resume
needs.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from olmo_data.config import ConfigError, TrainConfig, check_cycles_divide
from olmo_data.errors import DataError
from olmo_train.checkpoint import (
    DCP_METADATA,
    EXACT_FILE,
    MODEL_FILE,
    LoadHooks,
    is_unsharded,
    load_checkpoint,
    localize,
    read_metadata,
    read_sharded,
)
from olmo_train.distributed import Dist, unwrap
from olmo_train.nn.lora import adapters, is_adapter_key, kaiming_uniform, merge_state, seeded, target_names, update

log = logging.getLogger("olmo_train")


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this rank (an FSDP2 shard is gathered: a collective, every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def assign_full(t: torch.Tensor, value: torch.Tensor) -> None:
    """Write the whole-tensor `value` into `t`: all of it, or (FSDP2) this rank's shard of it, without
    communication (every rank holds the same `value`)."""
    value = value.to(device=t.device, dtype=t.dtype)
    if isinstance(t, DTensor):
        t.copy_(distribute_tensor(value, t.device_mesh, t.placements, src_data_rank=None))
    else:
        t.copy_(value)


def reset_mask(moment: torch.Tensor, mode: str, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """The entries a reset zeroes (True), chosen on `moment`: `prune` the `fraction` of least magnitude (ties
    broken by position), `random` as many at random, `zero` all, `none` none. Exactly round(fraction · numel)
    entries, whatever the values (a magnitude threshold would take more on ties)."""
    drop = torch.zeros(moment.numel(), dtype=torch.bool, device=moment.device)
    k = round(fraction * moment.numel())
    if mode == "zero":
        drop[:] = True
    elif mode == "prune":
        drop[torch.argsort(moment.flatten().abs(), stable=True)[:k]] = True
    elif mode == "random":
        drop[torch.randperm(moment.numel(), generator=generator)[:k].to(moment.device)] = True
    elif mode != "none":
        raise ValueError(f"unknown optimizer reset {mode!r}")
    return drop.view_as(moment)


class ReLoRA:
    """The regime's work between steps: after every `merge_every`-th step, merge the adapters into the weights,
    restart them, and reset part of their optimizer state; each step, report their norms.

    The number of merges done is step // merge_every and each merge happens right after its step's optimizer
    step, before any evaluation or checkpoint of that step: a checkpoint always holds the post-merge state and a
    resumed run never merges again. Nothing here needs saving."""

    def __init__(self, cfg: TrainConfig, model: nn.Module, optim: torch.optim.Optimizer, d: Dist) -> None:
        self.cfg = cfg.relora
        self.seed = cfg.seed
        self.model = model
        self.modules = adapters(model)
        self.optim = optim
        self.d = d

    @classmethod
    def start(
        cls, cfg: TrainConfig, model: nn.Module, optim: torch.optim.Optimizer, total_steps: int, d: Dist
    ) -> ReLoRA | None:
        """Check the schedule against the run's length and log what trains; None when ReLoRA is off."""
        check_cycles_divide(cfg, total_steps)
        if cfg.relora.rank is None:
            return None
        relora = cls(cfg, model, optim, d)
        log.info(relora.describe())
        if cfg.scheduler.name != "cosine_restarts":
            log.warning(
                "ReLoRA with scheduler.name=%s: the merges do not fall on learning-rate restarts (ReLoRA's "
                "cosine_restarts re-warms the rate after each merge)",
                cfg.scheduler.name,
            )
        return relora

    def describe(self) -> str:
        """Trainable parameters and AdamW state against full rank (2 fp32 moments per trained value)."""
        adapter_ids = {id(p) for m in self.modules for p in (m.lora_A, m.lora_B)}
        params = list(unwrap(self.model).parameters())
        n_adapter = sum(p.numel() for p in params if id(p) in adapter_ids)
        n_trainable = sum(p.numel() for p in params if p.requires_grad)
        n_full = sum(p.numel() for p in params if id(p) not in adapter_ids)
        r = self.cfg
        blocks = len(unwrap(self.model).blocks)  # type: ignore[arg-type]
        share = f"{100 * n_trainable / n_full:.1f}%"
        return (
            f"ReLoRA: rank {r.rank} adapters (scale {r.alpha / (r.rank or 1):g}) on {', '.join(target_names(r))} "
            f"of {blocks} blocks, merged every {r.merge_every} steps, optimizer reset {r.optimizer_reset} "
            f"{r.fraction():g} | trainable {n_trainable:,} of {n_full:,} parameters ({share}: adapters "
            f"{n_adapter:,}, embeddings, norms and head {n_trainable - n_adapter:,}) | AdamW state "
            f"{8 * n_trainable / 1e6:.2f} MB against {8 * n_full / 1e6:.2f} MB at full rank ({share})"
        )

    def after_step(self, step: int) -> dict[str, float]:
        """Metrics of the step (adapter norms as trained in it), and the merge when the step ends a cycle."""
        out = self.norms()
        every = self.cfg.merge_every or 0
        if step % every == 0:
            merge = step // every
            out["relora/update_norm"] = self.merge(merge)
            zeroed, low, high = self.reset_optimizer(merge)
            out["relora/optimizer_zeroed_fraction"] = zeroed
            log.info(
                "merge %d after step %d: |scale*B*A| %.4g merged; optimizer reset %s zeroed %.4f of the adapters' "
                "moments (per tensor %.4f..%.4f)",
                merge,
                step,
                out["relora/update_norm"],
                self.cfg.optimizer_reset,
                zeroed,
                low,
                high,
            )
        out["relora/merges"] = step // every
        return out

    @torch.no_grad()
    def norms(self) -> dict[str, float]:
        """The L2 norms of all A and of all B together (one all-reduce when sharded)."""
        local = torch.zeros(2, dtype=torch.float64, device=self.d.device)
        for m in self.modules:
            for i, p in enumerate((m.lora_A, m.lora_B)):
                shard = p.to_local() if isinstance(p, DTensor) else p
                local[i] += shard.double().square().sum()
        if self.modules and isinstance(self.modules[0].lora_A, DTensor):
            dist.all_reduce(local)
        a, b = local.sqrt().tolist()
        return {"relora/adapter_norm_A": a, "relora/adapter_norm_B": b}

    @torch.no_grad()
    def merge(self, merge: int) -> float:
        """W += scale·B·A for every adapter, then A re-drawn (Kaiming-uniform, seeded by merge and adapter) and B
        zeroed: the model's function is unchanged up to rounding. Returns the norm of all the updates merged."""
        total = 0.0
        for i, m in enumerate(self.modules):
            a = full_tensor(m.lora_A)
            delta = update(full_tensor(m.lora_B), a, m.lora_scale)
            total += float(delta.double().square().sum())
            assign_full(m.weight, full_tensor(m.weight) + delta)
            assign_full(m.lora_A, kaiming_uniform(tuple(a.shape), seeded(self.seed, merge, i)))
            m.lora_B.zero_()
        return math.sqrt(total)

    @torch.no_grad()
    def reset_optimizer(self, merge: int) -> tuple[float, float, float]:
        """Reset the adapters' optimizer moments (embeddings, norms and head keep theirs) and measure it: returns
        the fraction of all adapter moment entries that are zero afterwards, and its least and largest value over
        the moment tensors. The step counts are kept, as in the reference implementation.

        The entries are chosen once per parameter (`prune`: by the magnitude of its first moment) and zeroed in
        all of its moments. Pruning each moment by its own magnitude would keep a first moment where the second
        is zeroed, and Adam would then divide it by eps: A's gradient is exactly zero on the step after a merge
        (B is zero), so its second moment stays zero there and A jumps by lr · m / 1e-8. Measured on the demo
        model, the loss went from 6.3 to 11 within five steps of the first merge that way."""
        mode, fraction = self.cfg.optimizer_reset, self.cfg.fraction()
        zeros = total = 0
        per_tensor: list[float] = []
        for i, m in enumerate(self.modules):
            for j, p in enumerate((m.lora_A, m.lora_B)):
                state = self.optim.state.get(p, {})
                moments = sorted(k for k, v in state.items() if torch.is_tensor(v) and v.shape == p.shape)
                if not moments:
                    continue
                full = {key: full_tensor(state[key]) for key in moments}
                lead = full["exp_avg"] if "exp_avg" in full else full[moments[0]]
                drop = reset_mask(lead, mode, fraction, seeded(self.seed, merge, i, j, 1))
                for key in moments:
                    new = full[key].masked_fill(drop, 0)
                    assign_full(state[key], new)
                    z = int((new == 0).sum())
                    zeros, total = zeros + z, total + new.numel()
                    per_tensor.append(z / new.numel())
        if not per_tensor:
            return 0.0, 0.0, 0.0
        return zeros / total, min(per_tensor), max(per_tensor)


def has_adapters(model: nn.Module) -> bool:
    return bool(adapters(model))


def checkpoint_adapters(path: Path) -> dict[str, tuple[int, ...]]:
    """The adapter tensors a checkpoint holds, with their shapes ({} for a full-rank checkpoint), read from a
    sharded checkpoint's metadata or an unsharded one's relora.pt."""
    if is_unsharded(path):
        if not (path / EXACT_FILE).is_file():
            return {}
        exact = torch.load(path / EXACT_FILE, map_location="cpu", weights_only=True)
        return {k: tuple(v.shape) for k, v in exact.items() if is_adapter_key(k)}
    metadata = read_metadata(path / DCP_METADATA)
    out = {}
    for key, entry in metadata.state_dict_metadata.items():
        name = key.removeprefix("model.")
        if key.startswith("model.") and is_adapter_key(name):
            out[name] = tuple(getattr(entry, "size", ()))
    return out


def model_adapters(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's adapter tensors with their (global) shapes, keyed as in its state dict."""
    named = dict(unwrap(model).named_parameters()) | dict(unwrap(model).named_buffers())
    return {k: tuple(v.shape) for k, v in named.items() if is_adapter_key(k)}


def check_resume(path: Path, model: nn.Module) -> None:
    """A run continues only from a checkpoint with the same adapters (or, both full rank, none): otherwise the
    optimizer state and the weights' meaning differ. Says which way to go instead."""
    theirs, ours = checkpoint_adapters(path), model_adapters(model)
    if theirs == ours:
        return
    if not ours:
        raise DataError(
            f"{path}: a ReLoRA checkpoint (it holds low-rank adapters), but relora.rank is not set; continue it with "
            f"its relora settings, or train its merged weights in full rank with --load_path={path} "
            "--reset_trainer_state and a new save_folder"
        )
    if not theirs:
        raise DataError(
            f"{path}: a full-rank checkpoint, but this run trains ReLoRA adapters; start ReLoRA from its weights "
            f"with --relora.continue_from={path} and a new save_folder"
        )
    rank = next((s[0] for k, s in theirs.items() if k.endswith(".lora_A")), "?")
    raise DataError(
        f"{path}: its adapters (rank {rank}, {sum(k.endswith('.lora_A') for k in theirs)} linears) differ from this "
        "run's relora.rank / relora.target; continue with the checkpoint's settings, or start from its merged "
        f"weights with --relora.continue_from={path} and a new save_folder"
    )


def load_merged_weights(path: Path, model: nn.Module) -> None:
    """Weights only, when the checkpoint or the model has adapters: the checkpoint's plain merged weights go into
    the model's base weights (its adapters, if any, keep their fresh start). Every rank reads the whole model, as
    an unsharded load does; the caller has checked the files."""
    if (path / MODEL_FILE).is_file():
        state = torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True)
    else:
        state = merge_state(read_sharded(path, "model"))
    wanted = {k for k in unwrap(model).state_dict() if not is_adapter_key(k)}
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        raise ConfigError(
            f"{path}: its weights do not fit this run's model (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "give a checkpoint of the same model config"
        )
    try:
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"{path}: its weights do not fit this run's model config ({e})") from e


def continue_from(cfg: TrainConfig, model: nn.Module, d: Dist) -> None:
    """relora.continue_from: a fresh run (step 1, new optimizer, data from the start) from a checkpoint's or an
    imported model's weights, merged if it was a ReLoRA run; the same as load_path with reset_trainer_state."""
    assert cfg.relora.continue_from
    path = localize(cfg.relora.continue_from, d)
    log.info("starting from the weights of %s (relora.continue_from): a fresh run, first trained step 1", path)
    load_checkpoint(path, model, None, d, restore_rng=False, hooks=RELORA_LOAD)


class ReLoRALoad(LoadHooks):
    """Loading a checkpoint into a run that may train adapters, or from one that did: a resume needs the same
    adapters on both sides; weights alone go in merged, into the base weights, with the adapters afresh."""

    def check_resume(self, path: Path, model: nn.Module) -> None:
        check_resume(path, model)

    def load_weights(self, path: Path, model: nn.Module) -> bool:
        if not (has_adapters(model) or checkpoint_adapters(path)):
            return False
        load_merged_weights(path, model)
        return True


RELORA_LOAD = ReLoRALoad()
