"""A windowed attention layer against full attention on CPU: time and peak memory of forward + backward.

Three ways to run one layer's attention (4 heads of 64, batch 1, fp32, q/k/v laid out in memory as the model's
projections leave them) at each length:
- `full`: causal attention over every earlier token (SDPA's causal kernel: no mask, O(T) memory, T^2/2 work);
- `band-mask`: the window as one SDPA call with a (T, T) boolean mask, what a mask-based window costs (T^2 bytes
  of mask, and every score computed then discarded);
- `window`: the windowed layer as the model runs it (`olmo_train/nn/windows.window_attention`: blocks of queries,
  each against the keys its window reaches, through views of one shared band mask).
`--tiny-step` instead trains one step (forward, backward, AdamW) of configs/olmo3-tiny.yaml's model on one
sequence of `--lengths` tokens (eight documents) with windows of `--window`, with document masking as in the config
or `--no-documents` (its full-attention layer then holds no T x T mask either).

Each measurement runs in a fresh process and reports the step's time and its peak resident set size
(ru_maxrss), with the process's size before the step (torch and the inputs) so the step's own share shows.

    python benchmarks/attention_window.py                      # 4k, 16k, 64k; window 4096 (OLMo 3's)
    python benchmarks/attention_window.py --tiny-step --lengths 16384 --window 256
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


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_layer(variant: str, length: int, window: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from olmo_train.nn.windows import window_attention

    torch.manual_seed(0)
    leaves = [torch.randn(1, length, 4, 64, requires_grad=True) for _ in range(3)]
    q, k, v = (x.transpose(1, 2) for x in leaves)  # (B, H, T, D) over (B, T, H, D) memory, as the model has them
    before = rss_bytes()
    t0 = time.perf_counter()
    if variant == "full":
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif variant == "band-mask":
        i = torch.arange(length)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        y = window_attention(q, k, v, window)
    y.sum().backward()
    return {"step_s": time.perf_counter() - t0, "peak_rss_bytes": rss_bytes(), "before_bytes": before}


def tiny_step(length: int, window: int, documents: bool = True) -> dict[str, float]:
    import torch

    sys.path.insert(0, str(ROOT))
    from olmo_data.config import load_config
    from olmo_train.nn import Transformer, doc_ids_from_eos

    pattern = f"[{window},{window},{window},-1]"
    cfg = load_config(ROOT / "configs/olmo3-tiny.yaml", [f"--model.max_sequence_length={length}",
                      f"--model.sliding_window.pattern={pattern}", "--model.eos_token_id=0"])  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, cfg.model.vocab_size, (1, length))
    ids[0, :: max(1, length // 8)] = 0  # eight documents
    before = rss_bytes()
    t0 = time.perf_counter()
    loss = model(ids, labels=ids[:, 1:], doc_ids=doc_ids_from_eos(ids, 0) if documents else None)
    loss.backward()
    optim.step()
    return {"step_s": time.perf_counter() - t0, "peak_rss_bytes": rss_bytes(), "before_bytes": before}


def run_child(args: list[str], timeout: float) -> dict[str, float] | str:
    cmd = [sys.executable, __file__, "--child", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"over {timeout:.0f} s"
    if proc.returncode != 0:
        return f"failed ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode})"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--variants", nargs="+", default=["full", "band-mask", "window"])
    ap.add_argument("--tiny-step", action="store_true", help="one training step of the olmo3-tiny model instead")
    ap.add_argument("--no-documents", action="store_true", help="--tiny-step without document masking")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    ap.add_argument("--max-mask-gib", type=float, default=1.0, help="band-mask skipped above: its T x T mask's GiB")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        variant, length, window = args.child[0], int(args.child[1]), int(args.child[2])
        if variant.startswith("tiny-step"):
            out = tiny_step(length, window, documents=variant == "tiny-step")
        else:
            out = one_layer(variant, length, window)
        print(json.dumps(out))
        return
    variants = [f"tiny-step{'-no-documents' if args.no_documents else ''}"] if args.tiny_step else args.variants
    print("| tokens | variant | window | step (s) | peak RSS (MiB) | before the step (MiB) |")
    print("|---:|---|---:|---:|---:|---:|")
    for length in args.lengths:
        for variant in variants:
            gib = length * length / 2**30  # the band mask's bytes (bool; SDPA's CPU kernel takes it as fp32: 4x)
            if variant == "band-mask" and gib > args.max_mask_gib:
                print(f"| {length} | {variant} | {args.window} | not run: the mask alone is {gib:.0f} GiB "
                      f"(bool), {4 * gib:.0f} GiB as SDPA's fp32 mask | | |", flush=True)  # fmt: skip
                continue
            got = run_child([variant, str(length), str(args.window)], args.timeout)
            if isinstance(got, str):
                print(f"| {length} | {variant} | {args.window} | {got} | | |", flush=True)
                continue
            peak, before = got["peak_rss_bytes"] / 2**20, got["before_bytes"] / 2**20
            print(
                f"| {length} | {variant} | {args.window} | {got['step_s']:.2f} | {peak:.0f} | {before:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
