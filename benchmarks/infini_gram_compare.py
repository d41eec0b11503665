"""Benchmark: our suffix index against infini-gram 2.6.0 (OLMoTrace's engine) on the same token files, warm, in
one process: the count of an n-gram (both: how many places) and its find (ours: every place, sorted, what
`trace --tokens` uses; infini-gram's `find`: the suffix-array ranges only, no positions), median and p90 a
lookup, and the ratio ours / infini-gram. Also each index's build time (ours: divsufsort where installed, one
process; infini-gram: its bundled Rust indexer, one CPU) and size.

Corpora: the demo data (~2.9M tokens in 4 files, as benchmarks/spans_length.py prepares it), and synthetic
text-like tokens (benchmarks/suffix_index.py's: Zipf over a 50K vocabulary with 2% copied passages, 50M-token
files). 400 n-grams of 2 to 20 tokens taken at random from the files (seed 0), looked up alternately by both
after a warm-up pass over all of them (each engine's pages of each query read once); every count is checked
equal.

    python benchmarks/infini_gram_compare.py [--data runs/spans-bench] [--tokens 1e8] [--workdir DIR]
    python benchmarks/infini_gram_compare.py --config RUN.yaml [--index-dir DIR] --workdir DIR --cpus 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"median_ms": 1000 * statistics.median(times), "p90_ms": 1000 * times[int(0.9 * len(times))]}


def compare(
    config: dict[str, Any], work: Path, index_dir: str | None, queries: int = 400, cpus: int = 1
) -> dict[str, Any]:
    from olmo_data.dataset.instances import open_from_config
    from olmo_data.suffix_index import build_index, open_index
    from olmo_data.suffix_index.layout import index_folder
    from tests.infini_gram_reference import Reference, build_reference

    source = open_from_config(config)
    paths = [f.path for f in source.files]
    dtype = source.files[0].dtype
    tokens = sum(f.num_tokens for f in source.files)
    out: dict[str, Any] = {"tokens": tokens, "files": len(paths)}
    if open_index(source, index_dir) is None:  # an existing index is used as it is (its own --shard-tokens)
        out["ours_build_s"] = build_index(source, index_dir=index_dir, progress=False).seconds
    out["ours_bytes_per_token"] = sum(folder_bytes(index_folder(p, index_dir)) for p in paths) / tokens
    if not (work / "infini-gram" / "table.0").exists():
        out["infini_gram_build_s"] = build_reference(paths, dtype, work / "infini-gram", mem_gib=4, cpus=cpus)
    ig_bytes = folder_bytes(work / "infini-gram") - 2 * tokens  # its own copy of the tokens left out
    out["infini_gram_bytes_per_token"] = ig_bytes / tokens
    ours = open_index(source, index_dir)
    assert ours is not None
    theirs = Reference(work / "infini-gram", paths, dtype)
    out["shards"] = sum(len(f.shards) for f in ours.files.values())

    rng = np.random.default_rng(0)
    files = [np.memmap(p, dtype=dtype, mode="r") for p in paths]
    qs = []
    for _ in range(queries):
        f = files[int(rng.integers(len(files)))]
        n = int(rng.integers(2, 21))
        at = int(rng.integers(0, len(f) - n))
        qs.append(f[at : at + n].astype(np.int64).tolist())
    for q in qs:  # warm: every query's pages of both indexes read once before any is timed
        ours.find(q), ours.count(q), theirs.engine.find(input_ids=q), theirs.engine.count(input_ids=q)
    times: dict[str, list[float]] = {k: [] for k in ("ours_count", "ig_count", "ours_find", "ig_find")}
    places = 0
    for q in qs:
        t0 = time.perf_counter()
        a = ours.count(q)
        t1 = time.perf_counter()
        b = theirs.engine.count(input_ids=q)["count"]  # type: ignore[typeddict-item]
        t2 = time.perf_counter()
        found = ours.find(q)
        t3 = time.perf_counter()
        theirs.engine.find(input_ids=q)
        t4 = time.perf_counter()
        assert a == b == sum(len(v) for v in found.values()), (q, a, b)
        places += a
        for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[k].append(dt)
    out["places"] = places
    out["texts_with_equal_spans"] = spans_agree(source, ours, theirs, files, rng)
    out |= {k: summary(v) for k, v in times.items()}
    for what in ("count", "find"):
        out[f"{what}_ratio_median"] = out[f"ours_{what}"]["median_ms"] / out[f"ig_{what}"]["median_ms"]
    return out


def spans_agree(source: Any, ours: Any, theirs: Any, files: list[np.memmap], rng: np.random.Generator) -> int:
    """Maximal spans (of at least 8 tokens) of 20 texts, each two passages of the data around tokens the data does
    not hold there, by our span search and by infini-gram's attribution: starts, ends and counts must be equal."""
    from olmo_data.trace.spans import find_spans

    for _ in range(20):
        pieces = []
        for n in (int(rng.integers(20, 60)), int(rng.integers(20, 60))):
            f = files[int(rng.integers(len(files)))]
            at = int(rng.integers(0, len(f) - n))
            pieces.append(f[at : at + n].astype(np.int64).tolist())
        text = [*pieces[0], 1, 2, 3, *pieces[1], 3, 2, 1]
        spans, _ = find_spans(source, text, 8, index=ours, max_places=10)
        got = [{"start": i, "end": j, "count": c} for i, j, _, c in spans]
        assert got == theirs.spans(text, 8), (text, got)
    return 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/spans-bench", help="the demo data's folder (spans_length.py's)")
    ap.add_argument("--tokens", type=float, default=1e8, help="synthetic corpus size (0: demo only)")
    ap.add_argument("--workdir", default="runs/infini-gram-compare")
    ap.add_argument("--config", help="compare on this run's token files instead (its index where --index-dir says)")
    ap.add_argument("--index-dir", default=None)
    ap.add_argument("--cpus", type=int, default=1, help="infini-gram's indexing processes")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from spans_length import prepare
    from suffix_index import make_tokens

    from olmo_data.io import read_yaml

    work = Path(args.workdir)
    if args.config:
        from olmo_data.io import read_yaml

        result = compare(read_yaml(args.config, "config"), work, index_dir=args.index_dir, cpus=args.cpus)
        print(json.dumps(result))
        (work / "results.json").write_text(json.dumps(result, indent=1))
        return
    results = {
        "demo": compare(read_yaml(str(prepare(Path(args.data))), "config"), work / "demo", str(work / "demo" / "ours"))
    }
    print(json.dumps(results["demo"]), flush=True)
    if args.tokens:
        n, per_file = int(args.tokens), 50_000_000
        paths = []
        (work / "synthetic").mkdir(parents=True, exist_ok=True)
        for k in range(max(1, -(-n // per_file))):
            path = work / "synthetic" / f"part-{k}.npy"
            size = min(per_file, n - k * per_file)
            if not path.exists() or path.stat().st_size != 2 * size:
                make_tokens(path, size, seed=k)
            paths.append(str(path))
        config = {"model": {"max_sequence_length": 128}, "data": {"paths": paths, "dtype": "uint16"}}
        results["synthetic"] = compare(config, work / "synthetic", str(work / "synthetic" / "ours"))
        print(json.dumps(results["synthetic"]), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
