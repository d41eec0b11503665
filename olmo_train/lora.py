"""ReLoRA: low-rank adapters on the block linears, merged into the frozen weights every `merge_every` steps and
restarted, with a partial reset of the adapters' optimizer state at each merge.

The adapters are a small module of our own rather than `peft`'s, for three reasons. It keeps the base weight under
its own name (`blocks.0.attention.w_q.weight`), so checkpoints, `export-hf`'s tables and a plain model's state dict
all keep their keys, and the adapters add only `lora_A`, `lora_B` and `lora_scale` beside it. Its parameters are
plain parameters of a plain module, so FSDP2 shards them with the rest of their block (one `fully_shard` per
block, as for full-rank training) and DCP saves and reshards them like any other. And every random number it draws
comes from a generator seeded by (seed, merge, adapter), never from the global RNG, so a re-initialised `A` is the
same whatever the world size and whether or not the run was resumed in between: that is what makes a resume
across a merge bitwise.

Merges and optimizer resets work on whole tensors: a sharded (FSDP2) parameter or moment is gathered, changed by
the same arithmetic as on one process, and each rank keeps its shard of the result. The merged weight is then
exactly what one process computes from the same W, A and B, and a state dict merged outside training (export,
unshard) gets the bits a merge in training would give on the same kind of device.

A checkpoint holds the exact training state (the unmerged W, A and B), so a run resumes bitwise. Whatever reads
a checkpoint's weights outside the trainer gets them merged: `read_model_state` (export-hf, generate) merges a
sharded checkpoint's adapters, and an unsharded checkpoint's `model.pt` holds the merged plain weights (loads into
a model without adapters) while `relora.pt` beside it keeps the unmerged W, A and B that a resume needs.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from olmo_data.errors import DataError
from olmo_train.config import LORA_TARGETS, ConfigError, ReLoRAConfig, TrainConfig, check_cycles_divide
from olmo_train.distributed import Dist, unwrap

log = logging.getLogger("olmo_train")

EXACT_FILE = "relora.pt"  # beside an unsharded checkpoint's model.pt: the adapted linears' unmerged state
ADAPTER_KEYS = ("lora_A", "lora_B", "lora_scale")


class LoRALinear(nn.Module):
    """y = x Wᵀ + scale · (dropout(x) Aᵀ) Bᵀ, W frozen. A starts Kaiming-uniform (as nn.Linear's weight) and B at
    zero: the update B·A is zero at first, and B gets a gradient on the first step (A from the second, once B is
    no longer zero). Were both zero, neither would ever get a gradient (the reference implementation's issue 18)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, generator: torch.Generator) -> None:
        super().__init__()
        if base.bias is not None:
            raise ValueError("LoRALinear wraps bias-free linears (the model has no biases)")
        self.weight: nn.Parameter = base.weight
        self.weight.requires_grad_(False)
        self.lora_A: nn.Parameter = nn.Parameter(kaiming_uniform((rank, base.in_features), generator))
        self.lora_B: nn.Parameter = nn.Parameter(torch.zeros(base.out_features, rank))
        self.lora_scale: torch.Tensor
        self.register_buffer("lora_scale", torch.tensor(alpha / rank))  # in the state dict: merges need it
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return F.linear(x, self.weight) + update * self.lora_scale.to(update.dtype)

    def extra_repr(self) -> str:
        out, rank = self.lora_B.shape
        return f"in={self.lora_A.shape[1]}, out={out}, rank={rank}, scale={float(self.lora_scale):g}"


def kaiming_uniform(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """nn.Linear's default init (bound 1/sqrt(fan_in)), drawn from `generator`."""
    return nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)


def seeded(*key: int) -> torch.Generator:
    """A CPU generator for one purpose: (seed, merge, adapter, ...) -> an independent stream."""
    state = np.random.SeedSequence([k & 0xFFFFFFFF for k in key]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def target_names(cfg: ReLoRAConfig) -> list[str]:
    """The block linears (attribute names inside `attention` / `mlp`) that get adapters, in block order."""
    wanted = {n for t in cfg.target for n in LORA_TARGETS.get(t, (t,))}
    return [n for names in LORA_TARGETS.values() for n in names if n in wanted]


def add_adapters(model: nn.Module, cfg: TrainConfig) -> None:
    """Replace the targeted linears of every block by LoRALinear (nothing when relora.rank is not set). Call on the
    freshly initialised model, before it is sharded or replicated; the base weights stay those of the full-rank
    model of the same seed, and embeddings, norms and the output head keep training in full rank."""
    r = cfg.relora
    if r.rank is None:
        return
    index = 0
    for block in model.blocks:  # type: ignore[union-attr]
        for name in target_names(r):
            parent = block.attention if hasattr(block.attention, name) else block.mlp
            base = getattr(parent, name)
            setattr(parent, name, LoRALinear(base, r.rank, r.alpha, r.dropout, seeded(cfg.seed, 0, index)))
            index += 1


def adapters(model: nn.Module) -> list[LoRALinear]:
    """The model's adapters, in a fixed order (the same on every rank and world size)."""
    return [m for m in unwrap(model).modules() if isinstance(m, LoRALinear)]


def is_adapter_key(key: str) -> bool:
    return key.rpartition(".")[2] in ADAPTER_KEYS


def split_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A full (unsharded) model state dict -> (the plain merged weights, keyed as a model without adapters; the
    exact state of the adapted linears: their unmerged weight, A, B and scale). Without adapters: (state, {})."""
    prefixes = [k[: -len(".lora_A")] for k in state if k.endswith(".lora_A")]
    exact = {f"{p}.{n}": state[f"{p}.{n}"] for p in prefixes for n in ("weight", *ADAPTER_KEYS)}
    plain = {k: v for k, v in state.items() if not is_adapter_key(k)}
    for p in prefixes:
        plain[f"{p}.weight"] = state[f"{p}.weight"] + update(
            state[f"{p}.lora_B"], state[f"{p}.lora_A"], state[f"{p}.lora_scale"]
        )
    return plain, exact


def merge_state(state: dict[str, Any]) -> dict[str, Any]:
    """The plain merged weights of a full model state dict (the state dict itself when it has no adapters)."""
    return split_state(state)[0]


def update(b: torch.Tensor, a: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """scale·B·A: what a merge adds to W, by the one expression that merges in training and merges of a state
    dict (export, unshard) share, so that both give the same bits (on the same kind of device)."""
    return (b @ a) * scale


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this rank (an FSDP2 shard is gathered: a collective, every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assign(t: torch.Tensor, value: torch.Tensor) -> None:
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
            a = _full(m.lora_A)
            delta = update(_full(m.lora_B), a, m.lora_scale)
            total += float(delta.double().square().sum())
            _assign(m.weight, _full(m.weight) + delta)
            _assign(m.lora_A, kaiming_uniform(tuple(a.shape), seeded(self.seed, merge, i)))
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
                full = {key: _full(state[key]) for key in moments}
                lead = full["exp_avg"] if "exp_avg" in full else full[moments[0]]
                drop = reset_mask(lead, mode, fraction, seeded(self.seed, merge, i, j, 1))
                for key in moments:
                    new = full[key].masked_fill(drop, 0)
                    _assign(state[key], new)
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
    from olmo_train.checkpoint_safety import DCP_METADATA, read_metadata

    if (path / "model.pt").is_file():
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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from olmo_train.checkpoint_files import MODEL_FILE, read_sharded

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


def with_exact_state(path: Path, state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """An unsharded checkpoint's model.pt, completed by relora.pt for a model with adapters (the unmerged weights
    replace the merged ones: a bitwise resume)."""
    if has_adapters(model) and (path / EXACT_FILE).is_file():
        state = {**state, **torch.load(path / EXACT_FILE, map_location="cpu", weights_only=True)}
    return state


def continue_from(cfg: TrainConfig, model: nn.Module, d: Dist) -> None:
    """relora.continue_from: a fresh run (step 1, new optimizer, data from the start) from a checkpoint's or an
    imported model's weights, merged if it was a ReLoRA run; the same as load_path with reset_trainer_state."""
    from olmo_train import checkpoint as ckpt

    assert cfg.relora.continue_from
    path = ckpt.localize(cfg.relora.continue_from, d)
    log.info("starting from the weights of %s (relora.continue_from): a fresh run, first trained step 1", path)
    ckpt.load_checkpoint(path, model, None, d, restore_rng=False)
