"""What checksums.json costs: time to save and to load a sharded checkpoint with and without it, on CPU.

A model of the given shape (default: d_model 1024, 16 layers, vocabulary 50304, untied: about 304M parameters)
gets AdamW state from one optimizer step on zero gradients (step, exp_avg, exp_avg_sq for every parameter), so
the sharded checkpoint holds weights and two moments (about 3.6 GB). One process (a world of one), as
`python -m olmo_train` runs. Each variant runs --repeats times; the median is reported:

  save, checksums        checkpoint.save_sharded: DCP through the hashing writer, each file hashed as written
  save, plain            what save_sharded did before: dcp.save(checkpoint_id=...) and torch.save of the RNG file
  load, verified         checkpoint.load_checkpoint: every file hashed against checksums.json, then the safe load
  load, unverified       the same load of a checkpoint without checksums.json (metadata still read safely)
  load, DCP as before    dcp.load(checkpoint_id=...) with DCP's own reader and planner
  verify alone           checkpoint.integrity.verify: the hashing a verified load adds
  unsharded save, ...    checkpoint.save_unsharded (torch.save into a hashing stream) against torch.save to paths

Both saves fsync their files (DCP's default), so they include the write to disk. The loads read a checkpoint that
was just written and fits in memory, from the page cache: a cold disk adds its read time to every load, and a
verified load then reads the files twice (once to hash, once to load) unless they stay cached.

    python benchmarks/checkpoint_integrity.py                          # ~304M parameters
    python benchmarks/checkpoint_integrity.py --d-model 256 --layers 2 # seconds
    python benchmarks/checkpoint_integrity.py --d-model 2048 --mlp 8192 --tied --no-unsharded  # OLMo-1B: 1.18B

The loads load into the model and optimizer that were saved (the values do not change), so the machine holds one
copy of the state: OLMo-1B's 14 GB of weights and moments fit in 24 GiB that way, not twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from olmo_data.config import ModelConfig, OptimizerConfig  # noqa: E402
from olmo_train import checkpoint as ckpt  # noqa: E402
from olmo_train.checkpoint import integrity, safety  # noqa: E402
from olmo_train.distributed import Dist  # noqa: E402
from olmo_train.nn import Transformer  # noqa: E402
from olmo_train.train import build_optimizer  # noqa: E402

SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


Variant = tuple[str, Callable[[], Any], Callable[[], Any]]  # name, what is timed, what prepares it (untimed)


def model_with_adamw_state(cfg: ModelConfig) -> tuple[Transformer, torch.optim.Optimizer]:
    """A model and its AdamW with the state a step leaves (zeros), without a gradient's worth of memory: what a
    checkpoint of a run in progress holds."""
    model = Transformer(cfg)
    optim = build_optimizer(model, OptimizerConfig())
    for group in optim.param_groups:
        for p in group["params"]:
            optim.state[p] = {
                "step": torch.tensor(1.0),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
    return model, optim


def interleaved(variants: list[Variant], repeats: int) -> dict[str, dict[str, float]]:
    """Each variant `repeats` times, taking turns, so that a slow phase of the disk or the machine falls on all of
    them alike; min, median and max of each."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(repeats):
        for name, fn, before in variants:
            before()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--mlp", type=int, default=None, help="SwiGLU hidden size (default: the model's rule)")
    parser.add_argument("--tied", action="store_true", help="tie the output projection to the embedding")
    parser.add_argument("--no-unsharded", action="store_true", help="skip the unsharded saves (a full copy each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the checkpoints are written")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # DCP in a world of one warns on every call
    logging.basicConfig(level=logging.ERROR)

    torch.manual_seed(0)
    model_cfg = ModelConfig(
        d_model=args.d_model,
        n_heads=max(1, args.d_model // 64),
        n_layers=args.layers,
        vocab_size=args.vocab,
        mlp_hidden_size=args.mlp,
        max_sequence_length=256,
        weight_tying=args.tied,
    )
    model, optim = model_with_adamw_state(model_cfg)
    params = sum(p.numel() for p in model.parameters())

    root = Path(tempfile.mkdtemp(prefix="olmo-ckpt-integrity-", dir=args.tmp))
    try:
        state = ckpt.TrainerState(step=1)
        folder = root / "run"
        folder.mkdir()
        results: dict[str, Any] = {"parameters": params, "torch": torch.__version__}

        path, plain, aside = folder / "step1", root / "plain", root / "checksums.json"

        def save_plain() -> None:  # what save_sharded wrote before checksums
            (plain / "rng").mkdir(parents=True)
            model_sd, optim_sd = get_state_dict(model, optim)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(plain))
            torch.save(ckpt.rng_state(), plain / "rng" / "rank0.pt")

        def clear() -> None:  # untimed: save_sharded would otherwise move the previous copy aside and delete it
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(plain, ignore_errors=True)
            shutil.rmtree(folder / "step1-unsharded", ignore_errors=True)

        results.update(
            interleaved(
                [
                    ("save, checksums", lambda: ckpt.save_sharded(folder, model, optim, state, -1, SINGLE), clear),
                    ("save, plain", save_plain, clear),
                ],
                args.repeats,
            )
        )
        ckpt.save_sharded(folder, model, optim, state, -1, SINGLE)
        results["checkpoint_bytes"] = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

        target, target_optim = model, optim  # one copy of the state in memory (see the docstring)

        def load() -> None:
            ckpt.load_checkpoint(path, target, target_optim, SINGLE)

        def load_dcp() -> None:
            model_sd, optim_sd = get_state_dict(target, target_optim)
            dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))

        def with_checksums() -> None:
            if aside.exists():
                shutil.move(aside, path / integrity.CHECKSUMS)

        def without_checksums() -> None:
            if (path / integrity.CHECKSUMS).exists():
                shutil.move(path / integrity.CHECKSUMS, aside)

        load_dcp()  # warm-up: the first load of a process pays for imports and allocations
        loads: list[Variant] = [
            ("load, verified", load, with_checksums),
            ("load, unverified", load, without_checksums),
            ("load, DCP as before", load_dcp, without_checksums),
            ("verify alone", lambda: integrity.verify(path), with_checksums),
        ]
        results.update(interleaved(loads, args.repeats))
        assert safety.read_metadata(path / safety.DCP_METADATA) is not None

        def save_unsharded_plain() -> None:
            (plain / "rng").mkdir(parents=True)
            model_sd, optim_sd = get_state_dict(model, optim, options=full)
            torch.save(model_sd, plain / "model.pt")
            torch.save(optim_sd, plain / "optim.pt")
            torch.save(ckpt.rng_state(), plain / "rng" / "rank0.pt")

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        unsharded: list[Variant] = [
            ("unsharded save, checksums", lambda: ckpt.save_unsharded(folder, model, optim, state, -1, SINGLE), clear),
            ("unsharded save, plain", save_unsharded_plain, clear),
        ]
        if not args.no_unsharded:
            results.update(interleaved(unsharded, args.repeats))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    gb = results["checkpoint_bytes"] / 1e9
    print(f"{params / 1e6:.0f}M parameters, sharded checkpoint {gb:.2f} GB, torch {torch.__version__}")
    for name, r in results.items():
        if isinstance(r, dict):
            print(f"  {name:26s} {r['median_s']:7.2f} s  (min {r['min_s']:.2f}, max {r['max_s']:.2f})")
    hashing = gb / results["verify alone"]["median_s"]
    print(f"  {'hashing rate':26s} {hashing:7.2f} GB/s (verify alone)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
