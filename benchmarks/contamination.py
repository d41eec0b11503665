"""Benchmark: `olmo-data contamination` over whole downstream tasks, by the scan and by the suffix index.

The data: the demo corpus (`olmo-data demo-data`: the standard library's sources, its 8192-token BPE tokenizer),
plus `--plant` PIQA validation instances as documents of their own (so that the report has contaminated instances
to trace to documents and steps), tokenized; `--copies N` repeats the token directory N times as N data paths (a
larger run with the same text; the copies link the token files, or with `--real-copies` copy them). Config:
configs/tiny.yaml on that data (100 steps of 16 x 128 tokens).

For each `--tasks` list and each search (`scan`, `index`, `auto`), the command runs as a user runs it, a fresh
process (`/usr/bin/time` for wall time and peak memory); the search time is the one the report states.

    python benchmarks/contamination.py --tasks piqa --tasks piqa,hellaswag,winogrande,... [--copies 1] [--plant 50]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def olmo_data(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "olmo-data"), *args], check=True, capture_output=True, text=True)


def prepare(work: Path, copies: int, plant: int, real: bool = False) -> Path:
    """The demo data (once per work directory), the planted shard, `copies` token directories and the config."""
    if not (work / "demo" / "tokenizer.json").exists():
        olmo_data("demo-data", "--destination", str(work / "demo"))
    documents = sorted(str(p) for p in (work / "demo" / "documents").glob("*.jsonl.gz"))
    if plant:
        from olmo_train.train import eval_instances

        shard = work / f"planted-{plant}.jsonl.gz"
        with gzip.open(shard, "wt") as f:
            for inst in eval_instances("piqa", plant):
                text = inst.texts[inst.gold or 0]
                f.write(json.dumps({"id": f"planted-piqa-{inst.index}", "text": text, "source": "planted"}) + "\n")
        documents.append(str(shard))
    tokens = work / f"tokens-plant{plant}"
    if not (tokens / "manifest.json").exists():
        olmo_data("tokenize", "--documents", *documents, "--tokenizer", str(work / "demo" / "tokenizer.json"),
                  "--destination", str(tokens), "--processes", "2")  # fmt: skip
    paths = [str(tokens)]
    for k in range(1, copies):
        copy = work / f"tokens-plant{plant}-{'real' if real else 'link'}{k}"
        if not copy.exists():  # the token files linked (the same bytes) or copied, their manifest and metadata copied
            copy.mkdir()
            for f in tokens.iterdir():
                if f.suffix == ".npy" and not real:
                    (copy / f.name).symlink_to(f.resolve())
                elif f.is_file():
                    shutil.copy2(f, copy / f.name)
        paths.append(str(copy))
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg["save_folder"] = str(work / "run")
    cfg["data"]["paths"] = paths
    config = work / f"config-{copies}x{'-real' if real else ''}-plant{plant}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config


def timed(*args: str) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one fresh `olmo-data` process."""
    t0 = time.perf_counter()
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M", str(BIN / "olmo-data"), *args], check=True, capture_output=True, text=True
    )
    return time.perf_counter() - t0, int(out.stderr.strip().splitlines()[-1]) // 1024, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", action="append", required=True, help="Comma-separated labels; repeat for more rows.")
    ap.add_argument("--searches", default="scan,index,auto")
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--plant", type=int, default=50)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--no-index", action="store_true", help="Do not build the suffix index (scan only).")
    ap.add_argument("--real-copies", action="store_true", help="Copy the token files (distinct pages), not link them.")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="olmo-contam-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    config = prepare(work, args.copies, args.plant, args.real_copies)
    t0 = time.perf_counter()
    if not args.no_index:
        olmo_data("index", str(config))
    print(f"data: {config}; index built (or found) in {time.perf_counter() - t0:.1f} s", flush=True)
    print("| tasks | instances | texts | tokens searched | search | chosen | search s | wall s | peak MiB | flagged |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for tasks in args.tasks:
        for search in args.searches.split(","):
            wall, rss, out = timed(
                "contamination", str(config), "--tasks", tasks, "--search", search, "--json",
                "--processes", str(args.processes),
            )  # fmt: skip
            report = json.loads(out)
            stage = report["stages"][0]
            instances = sum(t["instances"] for t in report["tasks"])
            flagged = sum(t["contaminated"] for t in report["tasks"])
            label = tasks if len(tasks) < 40 else f"{len(tasks.split(','))} tasks"
            chosen = "index" if stage["index"] else "scan"
            print(
                f"| {label} | {instances:,} | {stage.get('texts', '')} | {stage['tokens']:,} | {search} | {chosen} | "
                f"{stage['search_seconds']:.2f} | {wall:.1f} | {rss:,} | {flagged} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
