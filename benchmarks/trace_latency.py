"""Benchmark: one `olmo-data trace --tokens` and one `trace --spans` query, each in a fresh process (what a person
waits for), with the suffix index; median and range of N runs, alternating the two.

Python compiles every module it imports from source when no bytecode is cached (`PYTHONDONTWRITEBYTECODE=1` with
an editable install, as in this project's dev environment: ~65 modules a run); `--bytecode` first writes the
bytecode (`compileall` into `PYTHONPYCACHEPREFIX`, outside the checkout) and runs with it, as an installed package
runs.

    python benchmarks/trace_latency.py CONFIG [--runs 9] [--bytecode] [--text TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--bytecode", action="store_true")
    ap.add_argument("--text", default="def __init__(self, name, value): return self.name + value  # zorblax")
    args = ap.parse_args()
    import yaml

    cfg = yaml.safe_load(Path(args.config).read_text())
    first = sorted(Path(cfg["data"]["paths"][0]).glob("part-*.npy"))[0]
    tokens = ",".join(str(t) for t in np.fromfile(first, dtype=np.uint16)[5000:5012].tolist())
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.bytecode:
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="olmo-pyc-")
        packages = [str(root / p) for p in ("olmo_data", "cli", "olmo_train", "olmo_view")]
        subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], env=env, check=False)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # (the checkout holds no __pycache__; site-packages keep theirs)
        env.pop("PYTHONPYCACHEPREFIX", None)
    cli = [sys.executable, "-m", "olmo_cli.main", "trace", args.config]
    queries = {"tokens": [*cli, "--tokens", tokens], "spans": [*cli, "--spans", args.text]}
    for command in queries.values():  # warm the page cache and the document index
        subprocess.run(command, env=env, check=True, capture_output=True)
    times: dict[str, list[float]] = {k: [] for k in queries}
    for _ in range(args.runs):
        for name, command in queries.items():
            t0 = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t0)
    out = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for k, v in times.items()} | {
        "bytecode": args.bytecode
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
