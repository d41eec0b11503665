"""Benchmark: `olmo-data trace` on the 100B-token sparse dataset of `order_and_inspect.py`, and the token-sequence
scan rate of `trace --tokens` / `--text`.

1. Tracing one document through a one-epoch run of the 100B-token dataset (48.8M instances of 2048 tokens, 100
   token files with tokenize-style metadata): the first time in a fresh cache (every token file's document index
   is built once, which an `inspect-batch` would also do), then warm (indexes cached), through the API and as a
   fresh `olmo-data trace` process.
2. The scan: `find_tokens` over a dataset of random uint16 tokens (real pages, not sparse: default 1B tokens in 4
   files), with 1 and 2 processes; the rate is tokens per second from the page cache.

    python benchmarks/trace.py [--tokens 1e11] [--scan-tokens 1e9]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from order_and_inspect import make_sparse_dataset  # noqa: E402

from olmo_data.dataset.doc_index import DocIndex  # noqa: E402
from olmo_data.dataset.instances import open_from_config  # noqa: E402
from olmo_data.dataset.order import build_config_orders  # noqa: E402
from olmo_data.trace.find import find_documents, find_tokens, trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=1e11)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--mean-doc", type=int, default=50_000)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--global-batch-size", type=int, default=2048)
    ap.add_argument("--scan-tokens", type=float, default=1e9)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="olmo-trace-bench-"))
    results: dict[str, object] = {"cpu_count": os.cpu_count()}
    try:
        data = work / "tokens"
        make_sparse_dataset(data, int(args.tokens), args.files, args.mean_doc, seed=0)
        source_cfg = {"paths": [str(data)]}
        cfg = {
            "seed": 6198,
            "save_folder": str(work / "run"),
            "global_train_batch_size": args.global_batch_size,
            "max_duration": "1ep",
            "model": {"max_sequence_length": args.sequence_length},
            "data": source_cfg,
        }
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(cfg))
        source = open_from_config(cfg)
        build_config_orders(cfg)  # the run's order, as the trainer writes it
        results["instances"] = len(source)
        doc_id = f"doc-{args.files // 2}-17"
        cache = work / "cache"
        os.environ["OLMO_DATA_CACHE"] = str(cache)

        def trace_once() -> int:
            report = trace(cfg, find_documents(source, [doc_id], doc_index=DocIndex(str(cache))), source=source)
            return len(report.hits)

        t0 = time.perf_counter()
        results["hits"] = trace_once()
        results["first_trace_s"] = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            trace_once()
            warm.append(time.perf_counter() - t0)
        results["warm_trace_s"] = warm
        cli = []
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "olmo_cli.main", "trace", str(config), "--document", doc_id],
                check=True,
                stdout=subprocess.DEVNULL,
                env=env,
                cwd=ROOT,
            )
            cli.append(time.perf_counter() - t0)
        results["cli_trace_s"] = cli
        shutil.rmtree(data, ignore_errors=True)

        scan_dir = work / "scan"
        scan_dir.mkdir()
        rng = np.random.default_rng(0)
        per_file = int(args.scan_tokens) // 4
        paths = []
        for k in range(4):
            path = scan_dir / f"part-{k}.npy"
            for lo in range(0, per_file, 50_000_000):
                with open(path, "ab") as f:
                    rng.integers(0, 50_000, size=min(50_000_000, per_file - lo), dtype=np.uint16).tofile(f)
            paths.append(str(path))
        scan_source = open_from_config({"model": {"max_sequence_length": 2048}, "data": {"paths": paths}})
        sequence = np.fromfile(paths[2], dtype=np.uint16, count=8, offset=2 * (per_file // 2)).tolist()
        for processes in (1, 2):
            rates = []
            for _ in range(args.repeats):
                found, scan = find_tokens(scan_source, sequence, name="x", processes=processes, progress=False)
                assert any(t.start == per_file // 2 for t in found)
                rates.append(scan["tokens_per_second"])
            results[f"scan_tokens_per_s_{processes}p"] = rates
    finally:
        (work.parent / "trace-results.json").write_text(json.dumps(results, indent=2))
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print(f"{results['instances']:,} instances; {results['hits']} places of {doc_id!r}")
    print(f"first trace (builds {args.files} document indexes): {results['first_trace_s']:.2f} s")
    print(f"warm trace (API): median {med(results['warm_trace_s']):.2f} s")  # type: ignore[arg-type]
    print(f"olmo-data trace (fresh process, warm cache): median {med(results['cli_trace_s']):.2f} s")  # type: ignore[arg-type]
    for p in (1, 2):
        rate = med(results[f"scan_tokens_per_s_{p}p"])  # type: ignore[arg-type]
        print(f"scan, {p} process(es): median {rate / 1e6:.0f}M tokens/s")


if __name__ == "__main__":
    main()
