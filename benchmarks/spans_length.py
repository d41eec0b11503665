"""Benchmark: `trace --spans` search time and peak memory against the text's length, with the suffix index and by
the scan, on the demo data (the standard library, ~2.9M tokens in 4 token files).

Three kinds of text, each cut to 100 .. 20,000 tokens:
  corpus  documents of the demo corpus (pydoc_data/topics.py's tail, then the next longest modules): the data holds
          the text whole (one span, or two)
  other   this repository's own olmo_data/*.py, which the corpus does not hold: a few spans, mostly short
  lines   the corpus's 400 most frequent lines (of 12 characters or more) in random order: spans everywhere, each
          held tens to hundreds of times (`    def __repr__(self):` 233 times)
  pieces  400-character slices of random documents, one after another: a long span every ~100 tokens (the index's
          worst case here: each costs a walk of single searches, while the scan of 2.9M tokens is cheap)
Each search is run `--repeats` times, each time in a fresh process; the table shows the median time and the
largest peak memory.

Each (text, length, mode) runs in a fresh process (`--one`), which times `find_spans` (the maximal spans, how many
places hold each, and the first 1,000 places: what `trace --spans` searches before it maps places to steps) and
reports its peak resident set size (ru_maxrss, the process's imports included) under an address-space limit of
`--limit-gb`. The index and the scan must find the same spans and places, or the benchmark stops.

    python benchmarks/spans_length.py [--data runs/spans-bench] [--lengths 100,1000,3577,10000,20000]
    python benchmarks/spans_length.py --million build; then --million index, --million scan (each under prlimit)

--data is made when missing: `olmo-data demo-data`, `tokenize`, a one-epoch order and `olmo-data index`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def prepare(data: Path) -> Path:
    """The demo data, its tokens, a run config with an order, and its suffix index, in `data` (kept)."""
    config = data / "config.yaml"
    if config.exists():
        return config
    import yaml

    cli = [sys.executable, "-m", "olmo_cli.main"]
    subprocess.run([*cli, "demo-data", "--destination", str(data / "demo")], check=True)
    docs = sorted(str(p) for p in (data / "demo" / "documents").glob("*.jsonl.gz"))
    tokenizer = str(data / "demo" / "tokenizer.json")
    subprocess.run(
        [*cli, "tokenize", "--documents", *docs, "--tokenizer", tokenizer, "--destination", str(data / "tokens")],
        check=True,
    )
    cfg = {
        "seed": 5,
        "save_folder": str(data / "run"),
        "global_train_batch_size": 16,
        "max_duration": "1ep",
        "model": {"max_sequence_length": 128},
        "data": {"paths": [str(data / "tokens")]},
    }
    from olmo_data.dataset.order import build_config_orders

    build_config_orders(cfg, epochs=1)
    config.write_text(yaml.safe_dump(cfg))
    subprocess.run([*cli, "index", str(config)], check=True)
    return config


def texts(data: Path) -> dict[str, str]:
    import gzip

    docs = {}
    for path in sorted((data / "demo" / "documents").glob("*.jsonl.gz")):
        for line in gzip.open(path, "rt"):
            doc = json.loads(line)
            docs[doc["id"]] = doc["text"]
    corpus = docs["pydoc_data/topics.py"][-60_000:]
    for name in sorted(docs, key=lambda d: -len(docs[d])):
        if name != "pydoc_data/topics.py" and len(corpus) < 200_000:
            corpus += docs[name]
    other = "".join(p.read_text() for p in sorted((ROOT / "olmo_data").glob("*.py")))
    import collections
    import random

    lines = collections.Counter(line for text in docs.values() for line in text.split("\n") if len(line.strip()) >= 12)
    common = [line for line, _ in lines.most_common(400)]
    rng = random.Random(0)
    repeated = "\n".join(rng.choice(common) for _ in range(20_000))
    names = sorted(name for name in docs if len(docs[name]) > 2000)
    pieces = ""
    while len(pieces) < 200_000:
        text = docs[rng.choice(names)]
        at = rng.randrange(len(text) - 400)
        pieces += text[at : at + 400]
    return {"corpus": corpus, "other": other, "lines": repeated, "pieces": pieces}


def one(config: str, text_file: str, tokens: int, mode: str) -> None:
    """Search one text in this process, print its figures as JSON."""
    import numpy as np

    from olmo_data.dataset.instances import open_from_config
    from olmo_data.io import read_yaml
    from olmo_data.suffix_index import open_index
    from olmo_data.tokenizer import data_tokenizer
    from olmo_data.trace.spans import find_spans

    source = open_from_config(read_yaml(config, "the run config"))
    query = data_tokenizer(None, source).encode(Path(text_file).read_text()[: tokens * 20])[:tokens]
    index = open_index(source) if mode == "index" else None
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    found, _ = find_spans(source, query, 8, index=index, progress=False)
    seconds = time.perf_counter() - t0
    answer = [(i, j, c, {p: np.asarray(v).tolist() for p, v in at.items()}) for i, j, at, c in found]
    print(
        json.dumps(
            {
                "tokens": len(query),
                "mode": mode,
                "seconds": seconds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_before_mb": rss_before / 1024,
                "spans": len(found),
                "places": sum(c for *_, c, _ in answer),
                "digest": hashlib.sha256(json.dumps(answer).encode()).hexdigest()[:16],
            }
        )
    )


def million(data: Path, mode: str) -> None:
    """A 12-token line held 1,000,000 times (13M tokens, one file): the span is counted, 1,000 places listed."""
    import numpy as np

    from olmo_data.dataset.instances import open_from_config
    from olmo_data.suffix_index import build_index, open_index
    from olmo_data.trace.spans import find_spans

    path = data / "million" / "part-0.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.tile(np.concatenate([np.arange(10, 22), [0]]), 1_000_000).astype(np.uint16).tofile(path)
    source = open_from_config({"model": {"max_sequence_length": 16}, "data": {"paths": [str(path)], "dtype": "uint16"}})
    if mode == "build":
        build_index(source, progress=False)
        return
    t0 = time.perf_counter()
    found, _ = find_spans(source, [5, *range(10, 22), 6], 8, index=open_index(source) if mode == "index" else None)
    seconds = time.perf_counter() - t0
    spans = [(i, j, c, sum(len(v) for v in at.values())) for i, j, at, c in found]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps({"mode": mode, "spans (start, end, count, listed)": spans, "seconds": seconds, "peak_rss_mb": rss})
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/spans-bench")
    ap.add_argument("--lengths", default="100,300,1000,3577,10000,20000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit-gb", type=float, default=4.0, help="address-space limit of each search process")
    ap.add_argument("--one", nargs=4, metavar=("CONFIG", "TEXT", "TOKENS", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--million", choices=["build", "index", "scan"], help="the span held a million times, alone")
    args = ap.parse_args()
    if args.million:
        million(Path(args.data), args.million)
        return
    if args.one:
        one(args.one[0], args.one[1], int(args.one[2]), args.one[3])
        return
    data = Path(args.data)
    config = prepare(data)
    rows = []
    print("| text | tokens | spans | places | index s | index peak RSS MB | scan s | scan peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    limit = int(args.limit_gb * (1 << 30))
    for kind, text in texts(data).items():
        text_file = data / f"text-{kind}.txt"
        text_file.write_text(text)
        for tokens in [int(x) for x in args.lengths.split(",")]:
            got = {}
            for mode in ("index", "scan"):
                runs = []
                for _ in range(args.repeats):
                    cmd = [sys.executable, __file__, "--one", str(config), str(text_file), str(tokens), mode]
                    proc = subprocess.run(
                        cmd,
                        capture_output=True,
                        text=True,
                        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
                    )
                    if proc.returncode:
                        raise SystemExit(f"{kind} {tokens} {mode} failed:\n{proc.stderr[-2000:]}")
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                got[mode] = {
                    **runs[0],
                    "seconds": statistics.median(r["seconds"] for r in runs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                }
            if got["index"]["digest"] != got["scan"]["digest"]:
                raise SystemExit(f"{kind} {tokens}: the index and the scan disagree: {got}")
            rows.append({"text": kind, **{f"{m}_{k}": v for m, r in got.items() for k, v in r.items()}})
            r = rows[-1]
            print(
                f"| {kind} | {r['index_tokens']:,} | {r['index_spans']:,} | {r['index_places']:,} | "
                f"{r['index_seconds']:.2f} | {r['index_peak_rss_mb']:.0f} | {r['scan_seconds']:.2f} | "
                f"{r['scan_peak_rss_mb']:.0f} |",
                flush=True,
            )
    (data / "spans-length-results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
