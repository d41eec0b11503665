"""fp8 training (`float8.enabled`): the block linears become torchao's `Float8Linear`, whose matmuls cast their
inputs, weights and gradients to fp8 with dynamic scales (one per tensor, `tensorwise`, or one per row, `rowwise`)
while the weights themselves, the optimizer state and everything else stay in full precision.

torchao is an optional dependency (the `gpu` extra): it is imported here, lazily, only when fp8 is enabled, so the
rest of the trainer, and every tool that reads a checkpoint, neither needs nor imports it.

What is converted, and why the rest is not: the linears inside the blocks whose sizes are multiples of 16 (the fp8
GEMMs need it). The output head stays in high precision (bf16 on GPUs): its logits feed the loss directly, and the
chunked loss (olmo_train/nn/loss.py) multiplies by its weight without calling the module, so a converted head would not
even run in fp8. Embeddings and norms are no matmuls.

`Float8Linear` keeps the module's name and its `weight` parameter, so the state dict has the same keys as the plain
model's and checkpoints, unsharding and export-hf work unchanged. With `fsdp_float8_all_gather` (tensorwise under
FSDP2) torchao wraps each converted weight in a tensor subclass that FSDP gathers in fp8, half the bytes of bf16; a
state-dict hook unwraps it again, so no checkpoint file (sharded or not) holds a torchao type: a checkpoint must load
where torchao is not installed, and through `weights_only` unpickling. The scales of all such weights are computed
after each optimizer step in a single all-reduce (`refresh_scales`), rather than one all-reduce per weight.

Conversion happens before `parallelize`, so `torch.compile` and `fully_shard` see the fp8 modules (torchao's order).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from olmo_data.config import ConfigError, TrainConfig
from olmo_train.optional import quietly

log = logging.getLogger("olmo_train")

INSTALL = "pip install 'olmo-data[gpu]' (or pip install torchao)"
FP8_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def torchao_float8() -> Any:
    """`torchao.float8`, or a ConfigError that says which extra installs it."""
    try:
        with quietly():
            import torchao.float8 as float8
    except ImportError as e:
        raise ConfigError(f"config key 'float8.enabled': fp8 training needs torchao; install it with {INSTALL}") from e
    return float8


def has_fp8_matmuls(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_CAPABILITY


def emulate(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether torchao emulates the fp8 matmuls (in the weights' dtype) instead of running fp8 GEMMs: on any
    device without fp8 tensor cores unless `float8.emulate` says otherwise, which it may not on such a device."""
    hardware = has_fp8_matmuls(device)
    if cfg.float8.emulate is False and not hardware:
        raise ConfigError(
            f"config key 'float8.emulate': false, but {device} has no fp8 matmuls (they need a CUDA GPU of compute "
            f"capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or more, e.g. an H100); unset it to emulate them "
            "(slower than bf16: for tests only)"
        )
    if cfg.float8.emulate is None and not hardware:
        log.warning("float8: %s has no fp8 matmuls; emulating them (slower than bf16, for tests only)", device)
        return True
    return bool(cfg.float8.emulate)


def fsdp_all_gather(cfg: TrainConfig) -> bool:
    """fp8 all-gather of the weights: asked for, or by default wherever torchao supports it (tensorwise, FSDP2).
    The contradictory combinations were refused with the config (config._check_float8)."""
    f = cfg.float8
    if f.fsdp_float8_all_gather is not None:
        return f.fsdp_float8_all_gather
    return f.recipe == "tensorwise" and cfg.distributed_strategy == "fsdp"


def convertible(module: nn.Module, name: str) -> bool:
    """The linears fp8 training converts: those of the blocks, with both sizes multiples of 16."""
    if not isinstance(module, nn.Linear) or not name.startswith("blocks."):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module, cfg: TrainConfig, device: torch.device) -> list[str]:
    """Swap the model's convertible linears for torchao's `Float8Linear`, in place; returns their names (none when
    fp8 is off). Call before the model is compiled or sharded."""
    if not cfg.float8.enabled:
        return []
    float8 = torchao_float8()
    config = dataclasses.replace(
        float8.Float8LinearConfig.from_recipe_name(cfg.float8.recipe),
        emulate=emulate(cfg, device),
        enable_fsdp_float8_all_gather=fsdp_all_gather(cfg),
    )
    names = [name for name, module in model.named_modules() if convertible(module, name)]
    if not names:
        raise ConfigError(
            f"config key 'float8.enabled': no block linear of this model has sizes that are multiples of 16 "
            f"(model.d_model={cfg.model.d_model}), so nothing would train in fp8; choose such sizes or turn fp8 off"
        )
    model.to(device)  # fp8 all-gather wraps the weights in a tensor subclass: create it where it will live
    float8.convert_to_float8_training(model, module_filter_fn=convertible, config=config)
    for name in names:
        model.get_submodule(name).register_state_dict_post_hook(_plain_weight)
    skipped = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in names and n != "lm_head"]
    log.info(
        "float8: %d linears train in fp8 (%s recipe%s%s)%s",
        len(names),
        cfg.float8.recipe,
        ", fp8 all-gather" if config.enable_fsdp_float8_all_gather else "",
        ", emulated" if config.emulate else "",
        f"; left in high precision, sizes not multiples of 16: {', '.join(skipped)}" if skipped else "",
    )
    return names


def refresh_scales(model: nn.Module, cfg: TrainConfig) -> None:
    """After each optimizer step, with fp8 all-gather: the fp8 scales of all gathered weights in one all-reduce,
    instead of one per weight inside each all-gather. The same numbers either way (torchao computes both alike)."""
    if cfg.float8.enabled and fsdp_all_gather(cfg):
        torchao_float8().precompute_float8_dynamic_scale_for_fsdp(model)


def _plain_weight(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """A state-dict hook on each converted linear: its weight as a plain tensor (or a DTensor of plain shards) that
    shares the parameter's storage, so loading a checkpoint in place still writes the parameter."""
    key = prefix + "weight"
    value = state.get(key)
    if isinstance(value, DTensor):
        inner = getattr(value.to_local(), "_tensor", None)
        if isinstance(inner, torch.Tensor):
            state[key] = DTensor.from_local(
                inner, value.device_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
            )
    elif isinstance(getattr(value, "_tensor", None), torch.Tensor):
        state[key] = value._tensor  # type: ignore[union-attr]
