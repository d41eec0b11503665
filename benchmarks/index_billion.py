"""Benchmark data: a corpus of N tokens made of the demo data's tokens (benchmarks/spans_length.py prepares them),
copied over and over with 2% of each copy's tokens replaced at random (seeded), in 50M-token uint16 files, and a
run config over it with its order built; so that a text from the demo documents has maximal spans held a few
hundred times, traced to steps, at any size. The index is then built and queried by the commands themselves:

    python benchmarks/index_billion.py --data runs/spans-bench --out /tmp/billion --tokens 1e9
    /usr/bin/time -v olmo-data index /tmp/billion/config.yaml --processes 2 --no-progress
    olmo-data trace /tmp/billion/config.yaml --spans "$(cat /tmp/billion/text.txt)" -t /tmp/billion/tokenizer.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np

PER_FILE = 50_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/spans-bench", help="the demo data's folder (spans_length.py's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=float, default=1e9)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import yaml
    from spans_length import prepare

    from olmo_data.dataset.order import build_config_orders

    data = Path(args.data)
    prepare(data)
    demo = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted((data / "tokens").glob("part-*.npy"))])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n, paths = int(args.tokens), []
    for k in range(-(-n // PER_FILE)):
        size = min(PER_FILE, n - k * PER_FILE)
        tokens = np.resize(demo, size + k * PER_FILE % len(demo))[k * PER_FILE % len(demo) :].copy()
        at = rng.integers(0, size, size // 50)
        tokens[at] = demo[rng.integers(0, len(demo), len(at))]
        path = out / f"part-{k:05d}.npy"
        tokens.tofile(path)
        paths.append(str(path))
    cfg = {
        "seed": 1,
        "save_folder": str(out / "run"),
        "global_train_batch_size": 512,
        "max_duration": "1ep",
        "model": {"max_sequence_length": 2048},
        "data": {"paths": paths, "dtype": "uint16"},
    }
    build_config_orders(cfg, epochs=1)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copy(data / "demo" / "tokenizer.json", out / "tokenizer.json")
    docs = {}
    for p in sorted((data / "demo" / "documents").glob("*.jsonl.gz")):
        for line in gzip.open(p, "rt"):
            doc = json.loads(line)
            docs[doc["id"]] = doc["text"]
    longest = sorted(docs, key=lambda d: -len(docs[d]))  # about 100 tokens: two passages and made-up words
    text = docs[longest[0]][5000:5165] + " zorblax quimfendry " + docs[longest[1]][3000:3165]
    (out / "text.txt").write_text(text)
    print(f"{n:,} tokens in {len(paths)} files, config {out / 'config.yaml'}, text {out / 'text.txt'}")


if __name__ == "__main__":
    main()
