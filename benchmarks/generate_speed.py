"""Decode speed on CPU: `olmo_train.generate` against `transformers`' `generate` on the same weights.

Both models hold identical fp32 weights (ours exported through `olmo_train.convert`), get the same prompts and generate
the same number of new tokens (no stop id, so neither stops early), in one process, one thread count. Greedy and
beam search (4 beams), batch 1 and 8. Runs alternate (ours, theirs, ours, theirs, ...) so that load from other
processes hits both alike; the best of `--repeat` is reported, as decode tokens per second = batch x new tokens /
seconds, the prompt's forward pass (prefill) included. The outputs are compared too: greedy must be equal token
for token.

    python benchmarks/generate_speed.py               # the default "small" shape (78.8M parameters, 50K vocab)
    python benchmarks/generate_speed.py --shape tiny        # configs/tiny.yaml's model: per-token overhead
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from olmo_data.config import ModelConfig
from olmo_train.convert import hf_config, to_hf_state
from olmo_train.generate import generate
from olmo_train.nn import Transformer

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=128, n_heads=4, n_layers=4, mlp_hidden_size=384, vocab_size=8192, weight_tying=True),
    "small": dict(d_model=512, n_heads=8, n_layers=8, mlp_hidden_size=1536, vocab_size=50304),
}


def build(shape: str) -> tuple[Transformer, Any]:
    import transformers

    torch.manual_seed(0)
    ours = Transformer(ModelConfig(max_sequence_length=2048, rope_theta=500_000, **SHAPES[shape])).eval()
    config = hf_config(ours.cfg, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    theirs.load_state_dict(to_hf_state(ours.state_dict(), ours.cfg), strict=False)
    return ours, theirs.eval()


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, theirs = build(args.shape)
    params = sum(p.numel() for p in ours.parameters())
    threads = torch.get_num_threads()
    print(f"shape {args.shape}: {params / 1e6:.1f}M parameters, {threads} threads, torch {torch.__version__}")
    rows = []
    for batch, beams in ((1, 1), (8, 1), (1, 4), (8, 4)):
        prompt = torch.randint(
            0, ours.cfg.vocab_size, (batch, args.prompt_len), generator=torch.Generator().manual_seed(1)
        )
        n = args.new_tokens
        best = {"ours": float("inf"), "transformers": float("inf")}
        outs: dict[str, Any] = {}

        def run_ours(steps: int, prompt: torch.Tensor = prompt, beams: int = beams) -> Any:
            return generate(ours, prompt, steps, beam_size=beams)

        def run_theirs(steps: int, prompt: torch.Tensor = prompt, beams: int = beams) -> Any:
            return theirs.generate(
                prompt,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                num_beams=beams,
                eos_token_id=None,
                pad_token_id=0,
                length_penalty=1.0,
            )

        with torch.no_grad():
            run_ours(4), run_theirs(4)  # warm-up: first calls pay one-time allocation costs
            for _ in range(args.repeat):
                for name, fn in (("ours", run_ours), ("transformers", run_theirs)):
                    dt, outs[name] = timed(fn, n)
                    best[name] = min(best[name], dt)
        same = outs["ours"].token_ids[:, 0].tolist() == outs["transformers"][:, args.prompt_len :].tolist()
        row = {
            "batch": batch,
            "beams": beams,
            "ours_tok_s": batch * n / best["ours"],
            "transformers_tok_s": batch * n / best["transformers"],
            "speedup": best["transformers"] / best["ours"],
            "same_tokens": same,
        }
        rows.append(row)
        print(json.dumps(row))
    print("| batch | beams | ours tok/s | transformers tok/s | ours / transformers | same tokens |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['beams']} | {r['ours_tok_s']:.1f} | {r['transformers_tok_s']:.1f} | "
            f"{r['speedup']:.2f}x | {'yes' if r['same_tokens'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
