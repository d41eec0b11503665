"""Benchmark: building a data order of 10^8 instances, and inspect-batch latency on a 100B-token dataset.

The 100B-token dataset is made of sparse files (`truncate`), so it costs no disk space: token files of uint32 zeros
with tokenize-style metadata (`part-*.csv.gz`, rows start,end,id,src,loc) that cut each file into documents of
random lengths. Reading zero pages of a sparse file is faster than reading a real disk, so the latencies measure
our code (index, order slice, document lookups, report) rather than the storage; with cold real data add one
random read per instance (about 0.1 ms each on NVMe).

    python benchmarks/order_and_inspect.py [--workdir DIR] [--keep]

Prints a markdown table (the numbers in BENCHMARKS.md come from it) and writes results.json in the workdir.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from synthetic_data import write_document_metadata, write_manifest  # noqa: E402

from olmo_data.dataset.doc_index import DocIndex  # noqa: E402
from olmo_data.dataset.instances import open_from_config  # noqa: E402
from olmo_data.dataset.order import build_config_orders, build_order, write_order  # noqa: E402
from olmo_data.run.batches import inspect_batch  # noqa: E402


def timed(fn, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def write_order_times(path: Path, n: int, repeats: int) -> list[float]:
    order = build_order(n, 6198, 0)
    return timed(lambda: write_order(str(path), order, seed=6198, epoch=0), repeats)


def make_sparse_dataset(directory: Path, total_tokens: int, files: int, mean_doc: int, seed: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = total_tokens // files
    entries = []
    for k in range(files):
        name = f"part-{k:05d}-00000"
        with open(directory / f"{name}.npy", "wb") as f:
            f.truncate(per_file * 4)
        lengths = rng.geometric(1 / mean_doc, size=2 * per_file // mean_doc + 10)
        ends = np.cumsum(lengths)
        ends = np.concatenate([ends[ends < per_file], [per_file]])
        n = write_document_metadata(directory / f"{name}.csv.gz", ends, k, f"s3://corpus/shard-{k:05d}.jsonl.gz")
        entries.append({"path": f"{name}.npy", "metadata": f"{name}.csv.gz", "tokens": per_file, "documents": n})
    write_manifest(directory, "uint32", entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None, help="Where to put the sparse dataset (default: a temp dir).")
    ap.add_argument("--keep", action="store_true", help="Keep the workdir.")
    ap.add_argument("--order-instances", type=float, default=1e8)
    ap.add_argument("--tokens", type=float, default=1e11)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--mean-doc", type=int, default=50_000, help="Mean document length (tokens) in the metadata.")
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--global-batch-size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="How many random steps to inspect.")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="olmo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()}
    try:
        # 1. the order of 10^8 instances: in memory, and written to disk with its side file
        n = int(args.order_instances)
        build_times = timed(lambda: build_order(n, 6198, 0), args.repeats)
        write_times = write_order_times(work / "order" / "global_indices.npy", n, args.repeats)
        results["build_order_s"] = build_times
        results["write_order_s"] = write_times

        # 2. a sparse 100B-token dataset, its order, and inspect-batch latency
        data = work / "tokens"
        t0 = time.perf_counter()
        make_sparse_dataset(data, int(args.tokens), args.files, args.mean_doc, seed=0)
        results["make_dataset_s"] = time.perf_counter() - t0
        cfg = {
            "seed": 6198,
            "save_folder": str(work / "run"),
            "global_train_batch_size": args.global_batch_size,
            "model": {"max_sequence_length": args.sequence_length},
            "data": {"paths": [str(data)]},
        }
        config_path = work / "config.yaml"
        import yaml

        config_path.write_text(yaml.safe_dump(cfg))
        t0 = time.perf_counter()
        source = open_from_config(cfg)
        results["open_dataset_s"] = time.perf_counter() - t0
        results["instances"] = len(source)
        t0 = time.perf_counter()
        build_config_orders(cfg)
        results["build_dataset_order_s"] = time.perf_counter() - t0
        cache = str(work / "cache")
        t0 = time.perf_counter()
        docs = DocIndex(cache)
        for f in source.files:
            docs.index_for(f.path)
        results["build_doc_indexes_s"] = time.perf_counter() - t0
        results["documents"] = int(sum(len(docs.index_for(f.path).starts) for f in source.files))  # type: ignore

        per_epoch = len(source) // args.global_batch_size
        rng = np.random.default_rng(1)
        steps = rng.integers(1, per_epoch + 1, size=args.steps).tolist()
        results["steps"] = steps
        cold = []
        for step in steps:  # a fresh process's view: dataset opened, indexes on disk but not yet mapped
            t0 = time.perf_counter()
            inspect_batch(str(config_path), step=step, doc_index=DocIndex(cache))
            cold.append(time.perf_counter() - t0)
        results["api_full_batch_s"] = cold
        warm_docs = DocIndex(cache)
        results["api_full_batch_reused_source_s"] = [
            timed(lambda s=s: inspect_batch(cfg, step=s, doc_index=warm_docs, source=source), 1)[0] for s in steps
        ]
        results["api_rank_part_s"] = [
            timed(
                lambda s=s: inspect_batch(str(config_path), step=s, rank=3, world_size=64, doc_index=DocIndex(cache)), 1
            )[0]
            for s in steps
        ]
        env = dict(os.environ, OLMO_DATA_CACHE=cache, PYTHONPATH=str(ROOT))
        cli = {}
        for label, extra in (("text", []), ("json", ["--json"]), ("rank", ["--rank", "3", "--world-size", "64"])):
            times = []
            for step in steps[:3]:
                t0 = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "olmo_cli.main",
                        "inspect-batch",
                        str(config_path),
                        "--step",
                        str(step),
                        *extra,
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    env=env,
                    cwd=ROOT,
                )
                times.append(time.perf_counter() - t0)
            cli[label] = times
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import olmo_cli.main"], check=True, env=env, cwd=ROOT)
        cli["interpreter_and_imports"] = [time.perf_counter() - t0]
        results["cli_s"] = cli
        results["load_average_after"] = os.getloadavg()
        results["disk_used_bytes"] = sum(p.stat().st_blocks * 512 for p in data.glob("*"))
        results["apparent_bytes"] = sum(p.stat().st_size for p in data.glob("*"))
    finally:
        (work / "results.json").write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"

    print(json.dumps(results, indent=2))
    print()
    print("| measurement | result |")
    print("|---|---|")
    print(f"| build_order, {n:.0e} instances (in memory) | {med(results['build_order_s'])} |")  # type: ignore
    print(f"| write order + side file, {n:.0e} instances | {med(results['write_order_s'])} |")  # type: ignore
    print(
        f"| dataset: {args.tokens:.0e} tokens, {args.files} files, {results['instances']:,} instances, "
        f"{results['documents']:,} documents | {results['apparent_bytes'] / 1e9:.0f} GB apparent, "
        f"{results['disk_used_bytes'] / 1e6:.1f} MB on disk |"
    )
    print(f"| open dataset (manifest + stat) | {results['open_dataset_s']:.3f} s |")
    print(f"| order of the dataset (build + write) | {results['build_dataset_order_s']:.2f} s |")
    print(f"| document side indexes, all files (once) | {results['build_doc_indexes_s']:.2f} s |")
    gbs, seq = args.global_batch_size, args.sequence_length
    print(f"| inspect_batch API, full batch {gbs}x{seq} (config path) | {med(results['api_full_batch_s'])} |")  # type: ignore
    print(f"| inspect_batch API, full batch, dataset already open | {med(results['api_full_batch_reused_source_s'])} |")  # type: ignore
    print(f"| inspect_batch API, rank 3 of 64 | {med(results['api_rank_part_s'])} |")  # type: ignore
    for label, times in cli.items():
        print(f"| CLI `inspect-batch` {label} (whole process) | {med(times)} |")


if __name__ == "__main__":
    main()
