"""Benchmark: warm lookups in the suffix index (issue 34): the count and the places of one n-gram, in one process,
on the demo data (2.9M tokens in 4 token files), with the default shards (one per file) and with 200K-token shards
(17), since a lookup searches every shard.

400 n-grams of 2 to 20 tokens taken from the token files at random (seed 0), each looked up once after 20 warm-up
lookups (pages and per-shard samples loaded); median and 90th percentile per lookup. `--code DIR` imports
`olmo_data` from another checkout (for the figures before a change; `RunIndex.count` is new, so only `find` there).

    python benchmarks/index_lookups.py [--data runs/spans-bench] [--code DIR]

--data is prepared as benchmarks/spans_length.py does (it reuses its folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(config: str, index_dir: str | None) -> dict[str, object]:
    import numpy as np

    from olmo_data.dataset.instances import open_from_config
    from olmo_data.io import read_yaml
    from olmo_data.suffix_index import open_index

    source = open_from_config(read_yaml(config, "the run config"))
    index = open_index(source, index_dir)
    assert index is not None
    rng = np.random.default_rng(0)
    files = [np.memmap(f.path, dtype=np.uint16, mode="r") for f in source.files]
    queries = []
    for _ in range(400):
        f = files[int(rng.integers(len(files)))]
        n = int(rng.integers(2, 21))
        at = int(rng.integers(0, len(f) - n))
        queries.append(f[at : at + n].astype(np.int64).tolist())
    for q in queries[:20]:
        index.find(q)
    out: dict[str, object] = {"shards": sum(len(f.shards) for f in index.files.values())}
    for what in ("count", "find"):
        if not hasattr(index, what):
            continue
        times, places = [], 0
        for q in queries:
            t0 = time.perf_counter()
            got = getattr(index, what)(q)
            times.append(time.perf_counter() - t0)
            places += got if what == "count" else sum(len(v) for v in got.values())
        times.sort()
        out[what] = {
            "median_ms": 1000 * statistics.median(times),
            "p90_ms": 1000 * times[int(0.9 * len(times))],
            "places": places,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/spans-bench")
    ap.add_argument("--code", default=str(ROOT), help="the checkout whose olmo_data to time")
    ap.add_argument("--one", nargs=2, metavar=("CONFIG", "INDEX_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        sys.path.insert(0, args.code)
        print(json.dumps(measure(args.one[0], args.one[1] or None)))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.spans_length import prepare

    data = Path(args.data)
    config = prepare(data)
    small = data / "index-200k"
    if not small.exists():
        cli = [sys.executable, "-m", "olmo_cli.main", "index", str(config)]
        subprocess.run([*cli, "--index-dir", str(small), "--shard-tokens", "200000"], check=True)
    for index_dir in ("", str(small)):
        cmd = [sys.executable, __file__, "--code", args.code, "--one", str(config), index_dir]
        got = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(json.dumps(got))


if __name__ == "__main__":
    main()
