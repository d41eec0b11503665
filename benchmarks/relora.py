"""ReLoRA against full-rank training at equal steps on the demo data: the loss curve, tokens/s and the optimizer's
memory, measured on the trainer as users run it (`python -m olmo_train`, one process).

Three runs on the same data order and the same initial weights (the seed's):
- full: N steps of AdamW on every weight, cosine_with_warmup;
- relora: N steps of ReLoRA from the random init: adapters of rank R on every block linear, merged every M steps,
  jagged cosine (cosine_restarts), optimizer pruned to 10% at each merge;
- warm: the full run's weights after W steps (its step-W checkpoint, `relora.continue_from`), then N - W steps of
  ReLoRA: the paper's recipe (a short full-rank warm start), the same N steps in all.
The model is configs/tiny.yaml widened (so that the block linears, which ReLoRA makes low-rank, hold most of the
weights rather than the tied embedding). Reported: the train loss curve (means over windows of `--every` steps),
the mean train loss of the last 10 steps, the loss on held-out data (the demo's last token file, never trained
on), and the optimizer state: the bytes of the AdamW tensors in the final unsharded checkpoint's optim.pt.

Speed is measured apart, because a long run's tokens/s drifts with the machine's load: `--repeats` pairs of short
runs (full rank, then ReLoRA, `--speed-steps` steps each, no evaluation or checkpoint), alternating so that load
hits both alike; per run the median tokens/s of its steps after the third, then the medians over runs and the
median of the paired ratios.

    python benchmarks/relora.py --steps 160 --warm 40 --merge-every 40 --every 20
    python benchmarks/relora.py --data runs/demo/tokens ...   # tokens made already (else made in --out)
    python benchmarks/relora.py --reuse ...                   # keep finished runs in --out, redo the rest
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


def demo_tokens(out: Path) -> Path:
    """The demo corpus tokenized with its own tokenizer (as the README's quick start makes it)."""
    tokens = out / "demo" / "tokens"
    if (tokens / "manifest.json").is_file():
        return tokens
    cli = [sys.executable, "-m", "olmo_cli.main"]
    subprocess.run([*cli, "demo-data", "--destination", str(out / "demo")], cwd=REPO, check=True)
    documents = sorted(str(p) for p in (out / "demo" / "documents").glob("*.jsonl.gz"))
    tokenizer = str(out / "demo" / "tokenizer.json")
    subprocess.run(
        [*cli, "tokenize", "--documents", *documents, "--tokenizer", tokenizer, "--destination", str(tokens)],
        cwd=REPO,
        check=True,
    )
    return tokens


def run(name: str, out: Path, args: argparse.Namespace, files: list[str], heldout: str, *extra: str) -> Path:
    """One training run; returns its save folder (with --reuse, a finished one is kept as it is)."""
    folder = out / name
    if args.reuse and not name.startswith("speed") and list(folder.glob("step*-unsharded/optim.pt")):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    evaluator = f"[{{label: heldout, paths: [{heldout}], max_batches: {args.eval_batches}}}]"
    cmd = [
        sys.executable,
        "-m",
        "olmo_train",
        "configs/tiny.yaml",
        f"--save_folder={folder}",
        f"--data.paths=[{','.join(files)}]",
        "--distributed_strategy=single",
        f"--model.d_model={args.d_model}",
        f"--model.n_heads={args.d_model // 32}",
        f"--model.n_layers={args.layers}",
        f"--model.mlp_hidden_size={3 * args.d_model}",
        f"--evaluators={evaluator}",
        f"--eval_interval={args.every}",
        "--save_num_checkpoints_to_keep=-1",
        "--console_log_interval=25",
        *extra,
    ]
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    report = next((line for line in proc.stderr.splitlines() if "ReLoRA: rank" in line), "")
    print(f"{name}: {time.perf_counter() - t0:.0f} s{(' | ' + report.split('] ', 1)[1]) if report else ''}")
    return folder


def summary(folder: Path, every: int, offset: int = 0) -> dict[str, Any]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["step"] += offset
    optim = torch.load(sorted(folder.glob("step*-unsharded"))[-1] / "optim.pt", weights_only=True)
    state_bytes = sum(t.numel() * t.element_size() for s in optim["state"].values() for t in s.values() if t.ndim)
    return {
        "curve": {
            r["step"]: statistics.mean(x["train/loss"] for x in rows[max(0, i + 1 - every) : i + 1])
            for i, r in enumerate(rows)
        },
        "last10": statistics.mean(r["train/loss"] for r in rows[-10:]),
        "heldout": rows[-1]["eval/heldout/loss"],
        "optimizer_mb": state_bytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warm", type=int, default=50, help="full-rank steps before ReLoRA in the warm run")
    parser.add_argument("--merge-every", type=int, default=50)
    parser.add_argument("--restart-warmup", type=int, default=10)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--every", type=int, default=25, help="steps between loss-curve points and evaluations")
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of short runs for tokens/s")
    parser.add_argument("--speed-steps", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep finished runs found in --out")
    parser.add_argument("--data", type=Path, default=None, help="demo token directory (default: made in --out)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench-relora")
    args = parser.parse_args()
    tokens = args.data or demo_tokens(args.out)
    files = sorted(str(p) for p in tokens.glob("*.npy"))
    train_files, heldout = files[:-1], files[-1]
    common = [f"--max_duration={args.steps}", f"--save_interval_unsharded={args.steps}", "--save_interval=100000"]
    relora = [
        f"--relora.rank={args.rank}",
        f"--relora.merge_every={args.merge_every}",
        f"--relora.restart_warmup_steps={args.restart_warmup}",
        "--scheduler.name=cosine_restarts",
        "--relora.optimizer_reset=prune",
        "--relora.prune_fraction=0.9",
    ]
    full = run("full", args.out, args, train_files, heldout, *common, f"--save_interval={args.warm}")
    scratch = run("relora", args.out, args, train_files, heldout, *common, *relora)
    rest = args.steps - args.warm
    warm = run(
        "warm",
        args.out,
        args,
        train_files,
        heldout,
        f"--max_duration={rest}",
        f"--save_interval_unsharded={rest}",
        "--save_interval=100000",
        *relora,
        f"--relora.continue_from={full / f'step{args.warm}'}",
    )
    every = args.every
    results = {"full": summary(full, every), "relora": summary(scratch, every), "warm": summary(warm, every, args.warm)}
    speed = speeds(args, train_files, heldout, relora)
    points = list(range(every, args.steps + 1, every))
    print(f"\ntrain loss, mean of steps s-{every - 1}..s (warm: full rank up to step {args.warm}, then ReLoRA)")
    print("| run | " + " | ".join(str(s) for s in points) + " |")
    print("| --- |" + " ---: |" * len(points))
    for name, r in results.items():
        cells = [f"{r['curve'][s]:.3f}" if s in r["curve"] and s - every >= min(r["curve"]) - 1 else "" for s in points]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n| run | last-10 train loss | held-out loss | optimizer state |")
    print("| --- | ---: | ---: | ---: |")
    for name, r in results.items():
        print(f"| {name} | {r['last10']:.3f} | {r['heldout']:.3f} | {r['optimizer_mb']:.1f} MB |")
    full_rates, relora_rates = speed
    ratios = [b / a for a, b in zip(full_rates, relora_rates, strict=True)]
    print(
        f"\ntokens/s over {args.repeats} alternating pairs of {args.speed_steps}-step runs: full rank "
        f"{statistics.median(full_rates):,.0f} ({', '.join(f'{x:,.0f}' for x in full_rates)}), ReLoRA "
        f"{statistics.median(relora_rates):,.0f} ({', '.join(f'{x:,.0f}' for x in relora_rates)}); "
        f"ReLoRA / full, paired: {', '.join(f'{x:.3f}' for x in ratios)}, median {statistics.median(ratios):.3f}"
    )


def speeds(
    args: argparse.Namespace, files: list[str], heldout: str, relora: list[str]
) -> tuple[list[float], list[float]]:
    """Median tokens/s of alternating short runs: full rank, ReLoRA, full rank, ..."""
    short = [f"--max_duration={args.speed_steps}", "--save_interval=100000", "--eval_interval=100000"]
    full: list[float] = []
    low: list[float] = []
    for _ in range(args.repeats):
        one_cycle = [*relora, f"--relora.merge_every={args.speed_steps}"]  # cycles must divide the short run
        for name, extra, rates in (("speed-full", [], full), ("speed-relora", one_cycle, low)):
            folder = run(name, args.out, args, files, heldout, *short, *extra)
            rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            rates.append(statistics.median(r["throughput/tokens_per_second"] for r in rows[3:]))
    return full, low


if __name__ == "__main__":
    main()
