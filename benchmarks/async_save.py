"""How long the training loop blocks per sharded save: synchronous (`save_sharded`) against asynchronous
(`save_async: true`, `checkpoint.BackgroundSaves`), on CPU, one process (a world of one, as `python -m olmo_train`).

A model of the given shape (default: d_model 768, 12 layers, vocabulary 50304, untied: about 163M parameters) with
AdamW state (exp_avg, exp_avg_sq) is saved `--repeats` times each way, taking turns. Reported, median (min):

  sync blocked        save_sharded: the whole save (DCP write with hashing, fsync, checksums, rename)
  async blocked       BackgroundSaves.start: the directory, config-less RNG file, staging every tensor to a host
                      copy; the loop trains on from here
  async in background from start to the shards written (the future done), the loop meanwhile doing nothing
  async completion    BackgroundSaves.wait once the shards are written: checksums.json, trainer_state, rename

What a real loop gains is `sync blocked - async blocked - async completion`, provided a step's compute leaves the
background thread its share of the cores (on 2 CPU cores training and writing compete; on a GPU node they do not).

    python benchmarks/async_save.py
    python benchmarks/async_save.py --d-model 256 --layers 2 --repeats 3   # seconds
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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checkpoint_integrity import model_with_adamw_state  # noqa: E402

from olmo_data.config import ModelConfig  # noqa: E402
from olmo_train import checkpoint as ckpt  # noqa: E402
from olmo_train.distributed import Dist  # noqa: E402

SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the checkpoints are written")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # DCP in a world of one warns on every call
    logging.basicConfig(level=logging.ERROR)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # as init_distributed alone

    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=args.d_model,
        n_heads=max(1, args.d_model // 64),
        n_layers=args.layers,
        vocab_size=args.vocab,
        max_sequence_length=256,
    )
    model, optim = model_with_adamw_state(cfg)
    params = sum(p.numel() for p in model.parameters())

    root = Path(tempfile.mkdtemp(prefix="olmo-async-save-", dir=args.tmp))
    times: dict[str, list[float]] = {
        k: [] for k in ("sync blocked", "async blocked", "async in background", "async completion")
    }
    background = ckpt.BackgroundSaves(SINGLE)
    try:
        for r in range(args.repeats):
            state = ckpt.TrainerState(step=2 * r + 1)
            t0 = time.perf_counter()
            ckpt.save_sharded(root, model, optim, state, 1, SINGLE)
            times["sync blocked"].append(time.perf_counter() - t0)

            state = ckpt.TrainerState(step=2 * r + 2)
            t0 = time.perf_counter()
            background.start(root, model, optim, state, 1)
            times["async blocked"].append(time.perf_counter() - t0)
            assert background.in_flight is not None
            background.in_flight.future.result()
            times["async in background"].append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            background.wait()
            times["async completion"].append(time.perf_counter() - t1)
        size = sum(p.stat().st_size for p in root.glob("step*/**/*") if p.is_file())
    finally:
        shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()
    results: dict[str, Any] = {"parameters": params, "checkpoint_bytes": size, "torch": torch.__version__}
    results.update({k: summary(v) for k, v in times.items()})
    print(f"{params / 1e6:.0f}M parameters, checkpoint {size / 1e9:.2f} GB, {args.repeats} saves each way")
    for k, v in times.items():
        print(f"  {k:22s} {statistics.median(v):7.2f} s (min {min(v):.2f})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
