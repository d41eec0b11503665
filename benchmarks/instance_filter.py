"""The instance filter's cost (`olmo_data.dataset.instance_filter`, OLMo 2's settings 13/1/32) against a training step.

Times `RepetitionFilter.filtered` on batches of 4096-token instances (int64, as the trainer's batches are), on two
kinds of data: random ids below 50,280 (nothing repeats: the cheap path), and Python's standard library sources as
byte tokens (code: indentation, rulers of `=` and `-`, so some instances are caught and many rows reach the full
check). Then the step of the tiny config's model on this CPU (forward, cross-entropy, backward, AdamW; the plain loop
of benchmarks/train_overhead.py) on the config's own batch (16 x 128) and on a batch of 4096-token instances, each
against the filter on the same batch. In the trainer the filter runs on the read-ahead threads, beside the step, so
even this cost is off the step's path unless the reads fall behind.

    python benchmarks/instance_filter.py            # from the repository root (PYTHONPATH=. without an install)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from olmo_data.config import load_config
from olmo_data.dataset.instance_filter import RepetitionFilter
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer

REPO = Path(__file__).resolve().parents[1]
L = 4096


def timed(fn: Callable[[], object], seconds: float) -> float:
    """Median seconds per call over repeated calls for about `seconds` (at least 5 calls)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stdlib_bytes(n: int) -> np.ndarray:
    """`n` instances of L byte tokens from the standard library's sources, in file order."""
    data, need = [], n * L
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        data.append(np.frombuffer(path.read_bytes(), dtype=np.uint8))
        need -= len(data[-1])
        if need <= 0:
            break
    return np.concatenate(data)[: n * L].astype(np.int64).reshape(n, L)


def step_seconds(cfg, batch: torch.Tensor, steps: int) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of a plain training step of the config's model on `batch` (after one untimed step)."""
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model)
    opt = build_optimizer(model, cfg.optimizer)
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        logits = model(batch)[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"))
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per filter measurement")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of the tiny config's batch")
    parser.add_argument("--long-batch", type=int, default=2, help="4096-token instances in the long step (0: skip)")
    args = parser.parse_args()
    rule = RepetitionFilter()
    print(f"rule: {rule}; numpy {np.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    data = {
        "random ids": np.random.default_rng(0).integers(0, 50_280, (512, L)),
        "stdlib bytes": stdlib_bytes(512),
    }
    print(f"\nfilter, instances of {L} tokens (int64):")
    print(f"{'data':14} {'caught':>8} " + " ".join(f"{f'batch {b}':>11}" for b in (1, 16, 64, 512)) + "  (us/instance)")
    for name, x in data.items():
        row = [timed(lambda b=b, x=x: rule.filtered(x[:b]), args.seconds) / b * 1e6 for b in (1, 16, 64, 512)]
        caught = f"{int(rule.filtered(x).sum())}/{len(x)}"
        print(f"{name:14} {caught:>8} " + " ".join(f"{v:11.1f}" for v in row))

    cfg = load_config(args.config, ["--data.paths=[x]"])
    B, S = cfg.global_train_batch_size, cfg.model.max_sequence_length
    batch = torch.from_numpy(data["stdlib bytes"].reshape(-1)[: B * S].reshape(B, S) % cfg.model.vocab_size)
    step = step_seconds(cfg, batch, args.steps)
    filt = timed(lambda: rule.filtered(batch.numpy()), args.seconds)
    print(f"\n{Path(args.config).name} model ({Transformer(cfg.model).num_params() / 1e6:.2f}M params), CPU:")
    print(f"  its own batch {B}x{S}: step {step * 1e3:,.1f} ms, filter {filt * 1e6:,.1f} us = {filt / step:.5%}")
    if args.long_batch:
        n = args.long_batch
        cfg = load_config(args.config, ["--data.paths=[x]", f"--model.max_sequence_length={L}"])
        long = torch.from_numpy(data["stdlib bytes"][:n] % cfg.model.vocab_size)
        step = step_seconds(cfg, long, 2)
        filt = timed(lambda: rule.filtered(long.numpy()), args.seconds)
        print(
            f"  a batch of {n}x{L}: step {step * 1e3:,.0f} ms ({step / n * 1e3:,.0f} ms per instance), filter "
            f"{filt * 1e6:,.1f} us ({filt / n * 1e6:,.1f} us per instance) = {filt / step:.5%}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
