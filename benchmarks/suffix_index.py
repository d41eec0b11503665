"""Benchmark: `olmo-data index` (build rate, bytes per token) and a 100-token `trace --spans` query with the index
against the scan.

The data: text-like synthetic tokens (Zipf-distributed over a 50K vocabulary, uint16), in files of
`--file-tokens`, where 2% of the text is copies of earlier 400-token passages (the long repeats that cost a
suffix sort extra rounds). The query: 40 tokens of one file, 20 random tokens, 40 tokens of another file, so it has
two maximal spans.

1. Build the index with the numpy engine (and with pydivsufsort when importable), `--processes` shards at once.
2. `find_spans` (the search behind `trace --spans`: the maximal spans and every place that holds them) with the
   index and by the scan, checked equal; and `find_tokens` (`trace --tokens`) of 40 tokens both ways. What
   follows the search (the order pass that finds the steps) is the same either way (benchmarks/trace.py).

    python benchmarks/suffix_index.py [--tokens 1e8] [--processes 2] [--engines numpy,divsufsort]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from olmo_data.dataset.instances import open_from_config  # noqa: E402
from olmo_data.suffix_index import build_index, open_index  # noqa: E402
from olmo_data.suffix_index.layout import SHARD_TOKENS  # noqa: E402
from olmo_data.suffix_index.sort import have_divsufsort  # noqa: E402
from olmo_data.trace.spans import find_spans  # noqa: E402


def make_tokens(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = np.minimum(rng.zipf(1.2, size=n), 50_000).astype(np.uint16)
    for _ in range(n // 20_000):  # 2% of the text: copies of earlier 400-token passages
        at, source = int(rng.integers(400, n - 400)), int(rng.integers(0, n - 400))
        tokens[at : at + 400] = tokens[source : source + 400]
    tokens.tofile(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=1e8)
    ap.add_argument("--file-tokens", type=float, default=5e7)
    ap.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="numpy,divsufsort", help="Which to build with (divsufsort where importable).")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="olmo-sa-bench-"))
    results: dict[str, object] = {"cpu_count": os.cpu_count(), "tokens": int(args.tokens)}
    try:
        paths = []
        for k in range(max(1, int(args.tokens // args.file_tokens))):
            path = work / f"part-{k}.npy"
            make_tokens(path, int(min(args.file_tokens, args.tokens)), seed=k)
            paths.append(str(path))
        cfg = {
            "seed": 1,
            "save_folder": str(work / "run"),
            "global_train_batch_size": 512,
            "max_duration": "1ep",
            "model": {"max_sequence_length": 2048},
            "data": {"paths": paths, "dtype": "uint16"},
        }
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
        source = open_from_config(cfg)
        engines = [e for e in args.engines.split(",") if e != "divsufsort" or have_divsufsort()]
        for engine in engines:
            index_dir = str(work / f"index-{engine}")
            summary = build_index(
                source,
                index_dir=index_dir,
                shard_tokens=args.shard_tokens,
                processes=args.processes,
                engine=engine,
                progress=False,
            )
            results[f"build_{engine}"] = {
                "seconds": summary.seconds,
                "tokens_per_s": summary.built_tokens / summary.seconds,
                "bytes_per_token": summary.bytes_per_token,
                "shards": summary.shards,
            }
        index = open_index(source, str(work / f"index-{engines[-1]}"))
        assert index is not None
        rng = np.random.default_rng(7)
        first = np.fromfile(paths[0], dtype=np.uint16)[1000:1040].astype(np.int64)
        last = np.fromfile(paths[-1], dtype=np.uint16)[-5000:-4960].astype(np.int64)
        query = [*first.tolist(), *rng.integers(40_000, 50_000, 20).tolist(), *last.tolist()]
        timings: dict[str, list[float]] = {"index": [], "scan": []}
        answers = {}
        for mode in ("index", "scan"):
            for _ in range(args.repeats if mode == "index" else 1):
                t0 = time.perf_counter()
                found, _ = find_spans(source, query, 8, index=index if mode == "index" else None, processes=2)
                timings[mode].append(time.perf_counter() - t0)
            answers[mode] = [(i, j, {p: v.tolist() for p, v in m.items()}, c) for i, j, m, c in found]
        assert answers["index"] == answers["scan"] and len(answers["index"]) >= 2, answers
        results["spans"] = [(i, j) for i, j, _, _ in answers["index"]]
        results["query_index_s"] = timings["index"]
        results["query_scan_s"] = timings["scan"]
        from olmo_data.trace.find import find_tokens

        for mode in ("index", "scan"):  # `trace --tokens` of the first 40 tokens
            t0 = time.perf_counter()
            find_tokens(source, query[:40], name="x", index=index if mode == "index" else None, processes=2)
            results[f"find_tokens_{mode}_s"] = time.perf_counter() - t0
    finally:
        (work.parent / "suffix-index-results.json").write_text(json.dumps(results, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))
    med = statistics.median
    print(f"{int(args.tokens):,} tokens")
    for engine in ("numpy", "divsufsort"):
        if f"build_{engine}" in results:
            b = results[f"build_{engine}"]
            assert isinstance(b, dict)
            print(
                f"build ({engine}, {args.processes} processes): {b['tokens_per_s'] / 1e6:.2f}M tokens/s, "
                f"{b['bytes_per_token']:.2f} bytes/token"
            )
    print(f"100-token --spans search: index median {med(timings['index']):.3f} s, scan {timings['scan'][0]:.2f} s")


if __name__ == "__main__":
    main()
