"""The trainer's overhead on CPU: tokens/s of `olmo_train` against a minimal plain-PyTorch loop, same model, same
data, same process.

The plain loop is what one would write by hand: batches sliced from a memory-mapped token file, forward, mean
cross-entropy, backward, gradient clipping, AdamW. The trainer adds the data order, label handling, global loss
normalisation, the all-reduces of a process group (world size 1), metrics and the batch fingerprint. Both run
the same number of steps; the first `--warmup` steps of each are not timed. Runs alternate (plain, trainer,
plain, trainer, ...) so that load from other processes on the machine hits both alike; the median is reported.

    python benchmarks/train_overhead.py                 # the tiny config's model, 1 process, fp32
    python benchmarks/train_overhead.py --strategy fsdp # FSDP2 on one process (its hooks' cost)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from olmo_data.config import load_config
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer, train

REPO = Path(__file__).resolve().parents[1]


def plain_loop(cfg, tokens_path: str, steps: int, warmup: int) -> float:  # type: ignore[no-untyped-def]
    """Tokens/s of a hand-written loop (median of per-step rates after warm-up)."""
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model)
    opt = build_optimizer(model, cfg.optimizer)
    L, B = cfg.model.max_sequence_length, cfg.global_train_batch_size
    data = np.memmap(tokens_path, dtype=np.uint16, mode="r")
    n = len(data) // L
    order = np.random.default_rng(cfg.seed).permutation(n)
    rates = []
    for step in range(steps):
        t0 = time.perf_counter()
        rows = order[step * B : (step + 1) * B]
        batch = torch.from_numpy(np.stack([data[i * L : (i + 1) * L] for i in rows]).astype(np.int64))
        logits = model(batch)[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)
        if step >= warmup:
            rates.append(B * L / (time.perf_counter() - t0))
    return statistics.median(rates)


def trainer_run(config: Path, overrides: list[str], folder: Path, warmup: int) -> float:
    cfg = load_config(config, [*overrides, f"--save_folder={folder}"])
    assert train(cfg) == 0
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["throughput/tokens_per_second"] for r in records[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"))
    parser.add_argument("--strategy", default="single", choices=["single", "fsdp", "ddp"])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.npy"
        probe = load_config(args.config, ["--data.paths=[x]"])
        vocab, L = probe.model.vocab_size, probe.model.max_sequence_length
        n_tokens = (args.steps + 1) * probe.global_train_batch_size * L
        np.random.default_rng(0).integers(0, vocab, n_tokens).astype(np.uint16).tofile(tokens)
        overrides = [
            f"--data.paths=[{tokens}]",
            f"--max_duration={args.steps}",
            f"--distributed_strategy={args.strategy}",
            f"--device_train_microbatch_size={probe.global_train_batch_size}",
            "--save_interval=null",
            "--save_interval_unsharded=null",
            "--console_log_interval=1000000",
        ]
        cfg = load_config(args.config, overrides)
        plain, trainer = [], []
        for r in range(args.repeats):
            plain.append(plain_loop(cfg, str(tokens), args.steps, args.warmup))
            trainer.append(trainer_run(Path(args.config), overrides, Path(tmp) / f"run{r}", args.warmup))
    p, t = statistics.median(plain), statistics.median(trainer)
    print(
        f"model {args.config} ({Transformer(cfg.model).num_params() / 1e6:.2f}M params), batch "
        f"{cfg.global_train_batch_size}x{cfg.model.max_sequence_length}, {args.steps} steps "
        f"({args.warmup} untimed), {args.repeats} alternating repeats, torch threads {torch.get_num_threads()}"
    )
    print(f"plain PyTorch loop : {p:10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in plain)})")
    print(f"olmo_train ({args.strategy:6}): {t:10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in trainer)})")
    print(f"trainer / plain    : {t / p:.3f}  ({100 * (t / p - 1):+.1f}%)  (ratio of the medians)")
    pairs = [b / a for a, b in zip(plain, trainer, strict=True)]
    print(
        f"paired ratios      : {', '.join(f'{x:.3f}' for x in pairs)}  (median {statistics.median(pairs):.3f}; "
        "each trainer run over the plain run just before it)"
    )


if __name__ == "__main__":
    main()
