"""Training throughput and MFU of `olmo_train` on GPUs, on synthetic token files, through the real trainer.

Runs the trainer in this process (one GPU; or launch with torchrun for several) for `--steps` steps of a config's
model, skips `--warmup` steps, and prints the median tokens/s per GPU and the MFU (model FLOPs utilisation:
6 x non-embedding params + attention FLOPs per token, over the GPU's bf16 dense peak). Also prints whether
flash-attn was used and the peak GPU memory.

    python benchmarks/gpu_throughput.py --config configs/olmo2-1b.yaml --micro-batch 4
    python benchmarks/gpu_throughput.py --config configs/olmo2-150m.yaml --micro-batch 16 --compile
    torchrun --nproc-per-node 8 benchmarks/gpu_throughput.py --config configs/olmo2-1b.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from olmo_data.config import load_config
from olmo_train.nn import model as model_module
from olmo_train.train import train

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "olmo2-1b.yaml"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=None, help="device_train_microbatch_size")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per step on each GPU")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--strategy", default="fsdp", choices=["fsdp", "ddp", "single"])
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--fp8", choices=["tensorwise", "rowwise"], help="fp8 block linears (float8.*; torchao)")
    parser.add_argument(
        "--ac-policy", default="full", choices=["full", "selective"], help="with --activation-checkpointing"
    )
    parser.add_argument("--document-masking", action="store_true", help="attention within documents (EOS-delimited)")
    parser.add_argument("--deterministic", action="store_true", help="deterministic kernels (deterministic: true)")
    parser.add_argument("--mean-doc-tokens", type=int, default=2000, help="synthetic tokens: mean document length")
    parser.add_argument("--tokens", default=None, help="real token files or directories instead of synthetic ones")
    parser.add_argument("--folder", default=None, help="where to write tokens and the run (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="more --key=value config overrides")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    probe = load_config(args.config, ["--data.paths=[x]"])
    L = args.seq_len or probe.model.max_sequence_length
    mbs = args.micro_batch or probe.device_train_microbatch_size
    gbs = mbs * args.accum * world
    tmp = Path(args.folder or tempfile.mkdtemp(prefix="olmo-gpu-bench-"))
    tokens = tmp / "tokens.npy"
    dtype = np.uint16 if probe.model.vocab_size <= 2**16 else np.uint32
    if rank == 0 and not tokens.exists() and args.tokens is None:
        n = (args.steps + 2) * gbs * L
        rng = np.random.default_rng(0)
        ids = rng.integers(1, probe.model.vocab_size, n)
        ids[rng.random(n) < 1 / args.mean_doc_tokens] = 0  # documents end at EOS id 0, geometric lengths
        ids.astype(dtype).tofile(tokens)
    data = (
        [f"--data.paths=[{args.tokens}]", "--data.dtype=null"]  # the token files' manifests say their dtype
        if args.tokens
        else [f"--data.paths=[{tokens}]", f"--data.dtype={dtype.__name__}"]
    )
    if args.document_masking:
        data += ["--model.document_masking=true"] + ([] if args.tokens else ["--model.eos_token_id=0"])
    overrides = [
        *data,
        f"--model.max_sequence_length={L}",
        f"--global_train_batch_size={gbs}",
        f"--device_train_microbatch_size={mbs}",
        f"--max_duration={args.steps}",
        f"--distributed_strategy={args.strategy}",
        f"--compile={str(args.compile).lower()}",
        f"--deterministic={str(args.deterministic).lower()}",
        f"--model.activation_checkpointing={str(args.activation_checkpointing).lower()}",
        f"--model.activation_checkpointing_policy={args.ac_policy}",
        f"--save_folder={tmp / 'run'}",
        "--save_interval=null",
        "--save_interval_unsharded=null",
        "--console_log_interval=5",
        *(["--float8.enabled=true", f"--float8.recipe={args.fp8}"] if args.fp8 else []),
        *args.overrides,
    ]
    if world > 1:  # the other ranks must see the token file before the trainer opens it
        torch.distributed.init_process_group("nccl")
        torch.distributed.barrier()
    cfg = load_config(args.config, overrides)
    train(cfg)
    if rank != 0:
        return
    records = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = records[args.warmup :]
    tps = statistics.median(r["throughput/tokens_per_second"] for r in timed)
    mfu = [r["throughput/mfu"] for r in timed if "throughput/mfu" in r]
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    flash = model_module.flash_attn_func is not None and cfg.model.flash_attention
    print(
        f"{name} x{world} | {args.config} | {args.strategy} | batch {gbs}x{L} (micro {mbs}, accum {args.accum}) | "
        f"compile {args.compile} | activation ckpt {args.activation_checkpointing} | flash-attn {flash} | "
        f"fp8 {args.fp8 or 'off'} | document masking {args.document_masking} | deterministic {args.deterministic}"
    )
    print(f"tokens/s (all GPUs): {tps:,.0f} | per GPU: {tps / world:,.0f}", end="")
    if mfu:
        print(f" | MFU {100 * statistics.median(mfu):.1f}%", end="")
    if torch.cuda.is_available():
        print(f" | peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", end="")
    print(f" | final loss {records[-1]['train/loss']:.3f}")


if __name__ == "__main__":
    main()
