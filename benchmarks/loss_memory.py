"""Peak memory of one training step with a 100K vocabulary: the plain loss (the micro-batch's full fp32 logits,
then cross-entropy) against the chunked one (`olmo_train/nn/loss.py`, what training uses).

The shape is the one the issue names: vocabulary 100,278 (dolma2's, embedding 100,352), d_model 128, 2 layers,
micro-batch 4 x 2048 tokens, fp32, CPU. Each variant runs in a fresh process (forward, backward, one AdamW step)
and reports its peak resident set size (ru_maxrss) and the step's time.

    python benchmarks/loss_memory.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_step(variant: str, batch: int, seq: int, vocab: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from olmo_data.config import ModelConfig
    from olmo_train.nn import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=128, n_heads=2, n_layers=2, vocab_size=vocab, embedding_size=100_352, max_sequence_length=seq
    )
    model = Transformer(cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (batch, seq))
    labels = ids[:, 1:].clone()
    t0 = time.perf_counter()
    if variant == "plain":
        logits = model(ids)[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="sum")
    else:
        loss = model(ids, labels=labels)
    loss.backward()
    optim.step()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"loss": float(loss), "peak_rss_bytes": float(peak), "step_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=100_278)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_step(args.child, args.batch, args.seq, args.vocab)))
        return
    results = {}
    for variant in ("plain", "chunked"):
        cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch), "--seq", str(args.seq)]
        out = subprocess.run([*cmd, "--vocab", str(args.vocab)], check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
        r = results[variant]
        gib = r["peak_rss_bytes"] / 2**30
        print(f"{variant:8s} peak RSS {gib:6.2f} GiB  step {r['step_s']:6.2f} s  loss {r['loss']:.4f}")
    ratio = results["plain"]["peak_rss_bytes"] / results["chunked"]["peak_rss_bytes"]
    difference = abs(results["plain"]["loss"] - results["chunked"]["loss"])
    print(f"plain / chunked peak: {ratio:.1f}x; loss difference {difference:.3g}")


if __name__ == "__main__":
    main()
