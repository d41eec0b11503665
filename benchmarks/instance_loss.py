"""What the per-instance loss record costs a training step.

One training step (forward, backward, AdamW) of the same model on the same micro-batch, without the record (the
summed loss only, what training did before) and with it: the rows' sums from the chunked loss
(`token_loss_rows`), the supervised counts, the gather into batch order (one rank here: no collective), the append
to instance_loss.bin and the per-source sums. The two variants alternate in one process in the order off, on, on,
off, ... (so neither always follows the other), and load from other processes falls on both alike; the overhead is
the difference of their medians. Each step is timed by the process's CPU time as well as the wall clock: on a
machine shared with other work the wall clock swings by more than the difference, the CPU time of one thread much
less.

    OMP_NUM_THREADS=1 python benchmarks/instance_loss.py
    OMP_NUM_THREADS=1 python benchmarks/instance_loss.py --z-loss 1e-4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from olmo_data.config import ModelConfig  # noqa: E402
from olmo_train.nn import Transformer  # noqa: E402
from olmo_train.train.instance_losses import InstanceLossLog, gather_rows, source_metrics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50_280)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12, help="Measured steps per variant (after 2 warm-up steps).")
    ap.add_argument("--z-loss", type=float, default=None, help="z_loss_multiplier (default: off).")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=args.d_model,
        n_heads=max(1, args.d_model // 64),
        n_layers=args.layers,
        vocab_size=args.vocab,
        max_sequence_length=args.seq,
    )
    model = Transformer(cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    labels = ids[:, 1:].clone()
    sources = np.arange(args.batch) % 3
    times: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        log = InstanceLossLog(Path(tmp) / "instance_loss.bin", enabled=True)
        log.start(0)
        for i in range(2 * (args.steps + 2)):
            variant = "on" if (i // 2) % 2 == i % 2 else "off"  # off on on off off on on off ...
            t0, c0 = time.perf_counter(), time.process_time()
            if variant == "off":
                out = model(ids, labels=labels, z_loss_multiplier=args.z_loss)
                loss = out if args.z_loss is None else out[0] + out[1]
            else:
                ce, z, rows = model(ids, labels=labels, z_loss_multiplier=args.z_loss, instance_losses=True)
                loss = ce if z is None else ce + z
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            if variant == "on":
                local = torch.stack([rows, (labels != -100).sum(-1).double()], dim=-1)
                gathered = gather_rows(local, 1)
                tokens = gathered[:, 1].astype(np.int64)
                log.write(i, gathered[:, 0], tokens)
                source_metrics(["a", "b", "c"], sources, gathered[:, 0], tokens)
            if i >= 4:
                times[variant].append(time.perf_counter() - t0)
                cpu[variant].append(time.process_time() - c0)
        log.close()
    print(
        f"d_model {args.d_model}, {args.layers} layers, vocab {args.vocab}, micro-batch {args.batch} x {args.seq}, "
        f"z-loss {args.z_loss}, torch threads {torch.get_num_threads()}, medians of {args.steps} steps each:"
    )
    for name, series in (("CPU time", cpu), ("wall clock", times)):
        off, on = statistics.median(series["off"]), statistics.median(series["on"])
        print(f"  {name}: {off:.3f} s without the record, {on:.3f} s with it: {100 * (on - off) / off:+.2f}%")


if __name__ == "__main__":
    main()
