"""Downstream evaluation speed: our path (`olmo-train eval`: requests sorted by length, inference mode, our model)
against the reference path (`transformers` + `olmo_eval`, as OLMo's in-loop evaluator feeds it: the task's requests
in their order, `collate_fn` batches padded to a multiple of 128, the `transformers` model's logits into
`ICLMetric`), same model, tasks, requests, batch size and process count (one).

The model is a randomly initialised OLMo-2 written by `transformers` itself (`save_pretrained`) with the
GPT-NeoX-20B tokenizer (a file of ../shared/tokenizers); ours loads that directory with `load_model`. Task building
(tokenizing the prompts) is the same code on both sides and is not timed; timed is the loop from requests to
metrics. Reported per path: seconds (best of --repeat), requests/s, tokens run through the model (padding
included), and the largest difference between the two paths' metrics.

    python benchmarks/downstream_eval.py
    python benchmarks/downstream_eval.py --tasks piqa --max-batches 4 --d-model 64 --layers 2 --repeat 1  # seconds
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import olmo_eval  # noqa: E402
import transformers  # noqa: E402

from olmo_data.tokenizer import load_tokenizer  # noqa: E402
from olmo_train.convert import load_model  # noqa: E402
from olmo_train.train.downstream import Timing, build_tasks, eval_tokenizer, evaluate_tasks  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "gpt-neox-20b.json"


def write_model(where: Path, args: argparse.Namespace) -> None:
    """A random OLMo-2 as `transformers` writes it, with the tokenizer beside it."""
    torch.manual_seed(0)
    config = transformers.Olmo2Config(
        vocab_size=50304,
        hidden_size=args.d_model,
        intermediate_size=args.d_model * 8 // 3 // 64 * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=args.d_model // 64,
        max_position_embeddings=args.seq_len,
        pad_token_id=1,
        eos_token_id=0,
        bos_token_id=None,
    )
    transformers.Olmo2ForCausalLM(config).save_pretrained(where)
    (where / "tokenizer.json").write_bytes(Path(args.tokenizer).read_bytes())


@torch.inference_mode()
def reference(hf: Any, tasks: list[Any]) -> tuple[dict[str, dict[str, float]], float, int]:
    """The requests each task of ours evaluated, in the task's own order, through collate_fn, transformers and
    ICLMetric; (metrics, seconds, tokens run)."""
    out, tokens, t0 = {}, 0, time.perf_counter()
    for task in tasks:
        picked = sorted(i for b in task.batches for i in b)
        metric = olmo_eval.ICLMetric(metric_type=task.dataset.metric_type)
        size = len(task.batches[0])
        for start in range(0, len(picked), size):
            batch = task.dataset.collate_fn([task.dataset[i] for i in picked[start : start + size]])
            logits = hf(input_ids=batch["input_ids"]).logits
            tokens += int(batch["input_ids"].numel())
            metric.update(batch, logits)
        out[task.label] = {k: float(v) for k, v in metric.compute().items()}
    return out, time.perf_counter() - t0, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="piqa,arc_easy,hellaswag")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batches", type=int, default=8, help="batches per task")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tokenizer", default=str(TOKENIZER))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    labels = args.tasks.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp), args)
        ours_model, _ = load_model(tmp)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp).eval()
    tok = eval_tokenizer(load_tokenizer(args.tokenizer, "hf"), eos_token_id=0, pad_token_id=1)
    tasks = build_tasks(labels, tok, args.seq_len, args.batch_size, args.max_batches)
    requests = sum(t.requests for t in tasks)
    ours_s, ref_s = [], []
    for _ in range(args.repeat):  # taking turns, so that drift in the machine's speed hits both
        timing = Timing()
        ours = evaluate_tasks(ours_model, tasks, torch.device("cpu"), bf16=False, timing=timing)
        ours_s.append(timing.seconds)
        ref, seconds, ref_tokens = reference(hf, tasks)
        ref_s.append(seconds)
    diff = max(abs(ours[label][k] - ref[label][k]) for label in ref for k in ref[label])
    result = {
        "tasks": labels,
        "requests": requests,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "model": f"d_model {args.d_model}, {args.layers} layers, vocab 50304",
        "ours_s": min(ours_s),
        "reference_s": min(ref_s),
        "ours_requests_per_s": requests / min(ours_s),
        "reference_requests_per_s": requests / min(ref_s),
        "ours_tokens": timing.tokens,
        "reference_tokens": ref_tokens,
        "speedup": min(ref_s) / min(ours_s),
        "max_metric_difference": diff,
        "example": {k: (ours[labels[0]][k], ref[labels[0]][k]) for k in list(ref[labels[0]])[:3]},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
