"""Process group setup and the three ways to spread the model over ranks: fsdp | ddp | single.

There is always a process group, also for one process started with plain `python -m olmo_train` (an in-memory
store, world size 1), so the loop, the checkpointer and the metrics have one code path whatever the launch.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from olmo_data.config import ConfigError, TrainConfig
from olmo_data.errors import DataError


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def device_named(text: str, flag: str = "--device") -> torch.device:
    """The device `text` names (cpu, cuda, cuda:N, mps), refused in one line when it names none or one this
    machine lacks: torch's own errors ("Expected one of cpu, cuda, ... device type at start of device string",
    "Torch not compiled with CUDA enabled") come from deep inside the first tensor move, as a traceback."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as e:
        raise DataError(f"{flag} {text}: not a device; give cpu, cuda or cuda:N") from e
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DataError(f"{flag} {text}: this machine has no CUDA GPU (or torch was built without CUDA): use cpu")
        if device.index is not None and device.index >= count:
            raise DataError(f"{flag} {text}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise DataError(f"{flag} {text}: MPS is not available on this machine: use cpu")
    elif device.type not in ("cpu", "mps"):
        raise DataError(f"{flag} {text}: this command runs on cpu or cuda, not {device.type}")
    return device


def init_distributed() -> Dist:
    """Join (or create) the process group: NCCL on GPUs, gloo on CPU; one GPU per local rank."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        timeout = datetime.timedelta(minutes=int(os.environ.get("OLMO_TRAIN_PG_TIMEOUT_MIN", 30)))
        if "RANK" in os.environ:  # launched by torchrun / srun with the env:// variables
            dist.init_process_group(backend, timeout=timeout, device_id=device if use_cuda else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def use_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    """bf16 mixed precision only on GPUs: CPU runs stay fp32 (bf16 on CPU is slow and changes numerics)."""
    return cfg.precision == "amp_bf16" and device.type == "cuda"


def parallelize(model: nn.Module, cfg: TrainConfig, d: Dist) -> nn.Module:
    """Wrap the model for the configured strategy. Call after the model is initialised identically on all
    ranks."""
    strategy = cfg.distributed_strategy
    if strategy == "single" and d.world_size > 1:
        raise ConfigError(
            f"config key 'distributed_strategy': 'single' runs one process but {d.world_size} were started; "
            "use fsdp or ddp, or launch one process"
        )
    model.to(d.device)
    blocks = getattr(model, "blocks", [])
    if cfg.compile:
        for block in blocks:
            block.compile()
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy()
        if use_bf16(cfg, d.device):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(blocks):
            # the last block's parameters are needed again right away in backward: keep them gathered
            fully_shard(block, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
        fully_shard(model, mp_policy=mp)
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of a step."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        if enabled:
            yield
        else:
            with model.no_sync():
                yield
        return
    set_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
    if set_sync is not None:
        set_sync(enabled)
    yield


def autocast(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast for ddp/single on GPU (FSDP casts parameters itself through its mixed-precision
    policy)."""
    if use_bf16(cfg, device) and cfg.distributed_strategy != "fsdp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return [float(v) for v in t.tolist()]


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_object(obj: object, src: int = 0) -> object:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: object) -> list[object]:
    """Every rank's `obj`, in rank order (a list of one without a process group of several)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def raise_together(check: Callable[[], object]) -> None:
    """Run `check` on every rank and raise the first rank's DataError on all of them: a rank that raised alone
    would leave the others waiting in the next collective until the timeout."""
    problem = None
    try:
        check()
    except DataError as e:
        problem = str(e)
    found = next((p for p in all_gather_objects(problem) if p), None)
    if found is not None:
        raise DataError(found)


def tell_launcher(message: str) -> None:
    """Hand `message` to torchrun as this process's error, so that the failure summary torchrun prints after a
    worker fails ends with our one line instead of a link to its docs.

    torchrun gives each worker an error file (TORCHELASTIC_ERROR_FILE) and shows a string message found there as
    the root cause; without the file it prints "To enable traceback see: ...", which hides the real error under
    thirty lines of launcher traceback. Outside torchrun there is no file and nothing to do.
    """
    import json
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):
        with open(path, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)
