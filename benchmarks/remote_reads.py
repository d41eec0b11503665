"""Benchmark: inspect-batch and training from remote token files, against the same files on local disk.

The remote files are served by `tests/flaky_server.py`, in a process of its own, on loopback, with a fixed latency
added to every request (0, 20 and 50 ms) and, for the last rows, 10% of the requests failing (503s with and without
Retry-After, 429s, dropped connections, truncated, short and long bodies).

1. `olmo-data inspect-batch CONFIG --step N` of a global batch of 2048 instances of 512 tokens (documents looked up
   in the metadata's side index, already built: the first look at a file builds it once), whole CLI processes,
   median of `--repeats` steps. The dataset is `--files` uint16 token files of `--file-tokens` tokens with label
   masks and tokenize-style metadata. Its batches' instances lie a few KB apart, so ranges of one file merge into
   a few large requests; `OLMO_DATA_REMOTE_COALESCE_GAP=0` rows turn merging off: one request per instance, as for
   a dataset so large that a batch's instances never neighbour.
2. Training `configs/tiny.yaml` with 128 instances of 32 tokens a step (many small reads a step), single process,
   tokens/s as the median of the per-step figures in metrics.jsonl after `--warmup` steps, and the mean time a step
   waited for its batch (`data/wait_s`: near zero when the read-ahead keeps up). Conditions take turns, so that load
   from other jobs on the machine hits them alike.

    python benchmarks/remote_reads.py [--workdir DIR] [--keep]

Prints markdown tables (the numbers in BENCHMARKS.md come from them) and writes results.json in the workdir.
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from synthetic_data import write_document_metadata, write_manifest  # noqa: E402

from olmo_data.dataset.order import build_config_orders  # noqa: E402


def make_token_dir(directory: Path, files: int, tokens: int, vocab: int, seed: int) -> None:
    """uint16 token files with label masks and metadata (documents of ~2000 tokens), and their manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    entries = []
    for k in range(files):
        name = f"part-{k:03d}"
        rng.integers(0, vocab, size=tokens, dtype=np.uint16).tofile(directory / f"{name}.npy")
        (rng.random(tokens) < 0.8).tofile(directory / f"{name}-mask.npy")
        ends = np.append(np.sort(rng.choice(np.arange(1, tokens), size=tokens // 2000, replace=False)), tokens)
        write_document_metadata(directory / f"{name}.csv.gz", ends, k, f"s3://corpus/shard-{k}.jsonl.gz")
        entries.append(
            {"path": f"{name}.npy", "label_mask": f"{name}-mask.npy", "metadata": f"{name}.csv.gz", "tokens": tokens}
        )
    write_manifest(directory, "uint16", entries)


@contextmanager
def served(root: Path, latency: float, failure_rate: float = 0.0) -> Iterator[str]:
    """The flaky server over `root` in a process of its own; yields its URL."""
    cmd = [sys.executable, "-m", "tests.flaky_server", str(root), "--latency", str(latency)]
    cmd += ["--failure-rate", str(failure_rate), "--seed", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait()


def cli_seconds(config: Path, steps: list[int], env: dict[str, str]) -> list[float]:
    """Wall time of whole `olmo-data inspect-batch CONFIG --step N` processes."""
    out = []
    for step in steps:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "olmo_cli.main", "inspect-batch", str(config), "--step", str(step)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
        out.append(time.perf_counter() - t0)
    return out


def batch_fingerprint(config: Path, step: int, env: dict[str, str]) -> str:
    cmd = [sys.executable, "-m", "olmo_cli.main", "inspect-batch", str(config), "--step", str(step)]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout
    return next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("batch fingerprint"))


def inspect_rows(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    www = work / "www"
    make_token_dir(www / "tok", args.files, args.file_tokens, 50_000, seed=0)
    base = {"seed": 6198, "global_train_batch_size": args.batch, "model": {"max_sequence_length": args.seq}}
    local = dict(base, save_folder=str(work / "local"), data={"paths": [str(www / "tok")]})
    (work / "local.yaml").write_text(yaml.safe_dump(local))
    build_config_orders(local)
    cli_seconds(work / "local.yaml", [1], env)  # builds the document indexes once
    want = batch_fingerprint(work / "local.yaml", 1, env)
    no_merge = {"OLMO_DATA_REMOTE_COALESCE_GAP": "0"}
    servers = [(0.0, 0.0), (0.02, 0.0), (0.05, 0.0), (0.05, 0.1)]
    conditions: list[tuple[str, Path, dict[str, str]]] = [("local files", work / "local.yaml", env)]
    first: dict[str, float] = {}
    with ExitStack() as stack:
        for k, (latency, failures) in enumerate(servers):
            url = stack.enter_context(served(www, latency, failures))
            remote = dict(base, save_folder=str(work / "remote"))
            remote["data"] = {"paths": [f"{url}/tok/"], "order_path": f"{url}/order-{k}"}
            config = work / f"remote-{k}.yaml"
            config.write_text(yaml.safe_dump(remote))
            build_config_orders(remote, location=str(www / f"order-{k}"))  # the local order, for these URLs
            run_env = dict(env, OLMO_DATA_CACHE=str(work / f"cache-{k}"))
            label = f"HTTP, {latency * 1000:.0f} ms latency" + (
                f", {failures:.0%} of requests failing" if failures else ""
            )
            first[label] = cli_seconds(config, [1], run_env)[0]  # downloads the metadata, builds its indexes
            if (got := batch_fingerprint(config, 1, run_env)) != want:
                raise SystemExit(f"{label}: batch fingerprint {got} != local {want}")
            conditions.append((label, config, run_env))
            if latency == 0.05:
                conditions.append((label + ", no merging (one request per instance)", config, run_env | no_merge))
        times: dict[str, list[float]] = {label: [] for label, _, _ in conditions}
        for repeat in range(args.repeats):  # conditions take turns: load from other jobs hits them alike
            for label, config, run_env in conditions:
                times[label] += cli_seconds(config, [2 + repeat], run_env)
            print({label: ts[-1] for label, ts in times.items()}, flush=True)
    return [{"where": label, "s": times[label], "first_s": first.get(label)} for label, _, _ in conditions]


def train_rows(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    www = work / "www-train"
    make_token_dir(www / "tok", 8, 262_144, 8192, seed=1)
    overrides = [
        f"--global_train_batch_size={args.train_batch}",
        "--device_train_microbatch_size=32",
        f"--model.max_sequence_length={args.train_seq}",
        f"--max_duration={args.train_steps}",
        "--distributed_strategy=single",
        "--save_interval=1000",
        "--save_interval_unsharded=1000",
        "--console_log_interval=1000",
    ]

    def train(name: str, data_path: str) -> dict[str, Any]:
        folder = work / name
        cmd = [sys.executable, "-m", "olmo_train", "configs/tiny.yaml", *overrides]
        cmd += [f"--save_folder={folder}", f"--data.paths=[{data_path}]"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        shutil.rmtree(folder)
        timed = records[args.warmup :]
        return {
            "tokens_per_s": statistics.median(r["throughput/tokens_per_second"] for r in timed),
            "data_wait_s": sum(r["data/wait_s"] for r in timed) / len(timed),
            "wall_s": wall,
            "fingerprints": [r["train/batch_fingerprint"] for r in records],
            "losses": [r["train/loss"] for r in records],
            "retries": records[-1].get("data/remote_retries"),
        }

    conditions = [("local files", None, 0.0), ("HTTP, 50 ms latency", 0.05, 0.0)]
    conditions.append(("HTTP, 50 ms latency, 10% of requests failing", 0.05, 0.1))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in conditions}
    for repeat in range(args.train_repeats):  # alternate the conditions: load from other jobs hits them alike
        for label, latency, failures in conditions:
            if latency is None:
                run = train(f"train-{repeat}-local", str(www / "tok"))
            else:
                with served(www, latency, failures) as url:
                    run = train(f"train-{repeat}-{failures}", f"{url}/tok/")
            runs[label].append(run)
            print(label, {k: v for k, v in run.items() if k not in ("fingerprints", "losses")}, flush=True)
    local = runs["local files"]
    rows = []
    for label, _, _ in conditions:
        rs = runs[label]
        rows.append(
            {
                "where": label,
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                "runs_tokens_per_s": [r["tokens_per_s"] for r in rs],
                "paired_ratios": [r["tokens_per_s"] / lr["tokens_per_s"] for r, lr in zip(rs, local, strict=True)],
                "retries": [r["retries"] for r in rs],
                "data_wait_s": statistics.median(r["data_wait_s"] for r in rs),
                "identical": all(
                    r["fingerprints"] == local[0]["fingerprints"] and r["losses"] == local[0]["losses"] for r in rs
                ),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None, help="Where to put the data (default: a temp dir).")
    ap.add_argument("--keep", action="store_true", help="Keep the workdir.")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-tokens", type=int, default=2**21)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5, help="inspect-batch runs (steps) per condition")
    ap.add_argument("--train-batch", type=int, default=128)
    ap.add_argument("--train-seq", type=int, default=32)
    ap.add_argument("--train-steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--train-repeats", type=int, default=2, help="runs per condition, alternating")
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="olmo-bench-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OLMO_DATA_CACHE=str(work / "cache"), OMP_NUM_THREADS="1")
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()}
    try:
        results["inspect"] = inspect_rows(args, work, env)
        if not args.skip_train:
            results["train"] = train_rows(args, work, env)
        results["load_average_after"] = os.getloadavg()
    finally:
        (work / "results.json").write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    local = statistics.median(results["inspect"][0]["s"])
    print(f"\n`inspect-batch` of {args.batch} x {args.seq} tokens, whole CLI process (median of {args.repeats})\n")
    print("| data | median | min | max | ratio to local | first look (builds doc indexes) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in results["inspect"]:
        med = statistics.median(row["s"])
        first = f"{row['first_s']:.2f} s" if row["first_s"] is not None else ""
        print(
            f"| {row['where']} | {med:.2f} s | {min(row['s']):.2f} s | {max(row['s']):.2f} s | "
            f"{med / local:.2f} | {first} |"
        )
    if "train" in results:
        base = results["train"][0]["tokens_per_s"]
        print(f"\nTraining configs/tiny.yaml, {args.train_batch} x {args.train_seq} tokens a step\n")
        print(
            "| data | tokens/s (median of runs) | ratio to local | paired ratios | mean wait for a batch | retries "
            "| same batches, losses |"
        )
        print("|---|---:|---:|---|---:|---|---|")
        for row in results["train"]:
            paired = ", ".join(f"{r:.3f}" for r in row["paired_ratios"])
            retries = ", ".join(str(r) for r in row["retries"] if r is not None)
            print(
                f"| {row['where']} | {row['tokens_per_s']:,.0f} | {row['tokens_per_s'] / base:.3f} | {paired} | "
                f"{1000 * row['data_wait_s']:.1f} ms | {retries} | {'yes' if row['identical'] else 'NO'} |"
            )


if __name__ == "__main__":
    main()
