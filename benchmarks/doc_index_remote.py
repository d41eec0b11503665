"""Benchmark: the documents of one batch's instances (one 8,192-token range in each of N remote token files) through
the range-readable document index (`part-N.docs.idx`), first call and repeated call, against the fallback that
downloads and parses each file's whole `.csv.gz` metadata.

The files are served by `tests/flaky_server.py` on loopback with `--latency` added to every request (HEADs and
ranged GETs alike), `concurrency` requests at a time (the reader's default, 64). N metadata files of `--docs`
documents each (`--big-files` of them with `--big-docs`, OLMo 3's 1.5M), made once and hard-linked under N names
(the server does not know, the client cannot tell: each URL is its own file, sized, cached and read on its own).
A repeated call is a later command: a new `DocIndex`, a new remote reader and an empty sizes memo, the disk caches
(file sizes, index heads, a batch's answers) kept; "another batch" is one too, for the next 8,192 tokens of each
file (its answers not cached: a block of rows and the ids of each file read), and once more with `prepare` given
the files only (lookups one after another, each reading its own block and ids; over `--unprepared-files`,
scaled). "A document by id" is what `trace
--document` needs: the files holding one id (one of a big file's middle rows), looked for in every file's sorted
hashes. The fallback is timed over `--fallback-files` files and scaled to N (linear: one download and one parse
per file; only files of `--docs` documents, so a lower bound where `--big-files` are larger); its answers are
checked equal to the index's on those files.

    python benchmarks/doc_index_remote.py [--files 500] [--docs 100000] [--big-files 4] [--big-docs 1500000]
        [--latency 0.05] [--fallback-files 20]
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from olmo_data.dataset.doc_index import DocIndex  # noqa: E402
from olmo_data.dataset.doc_index_file import write_index_file  # noqa: E402
from olmo_data.dataset.doc_index_ranges import RangeFileIndex  # noqa: E402
from olmo_data.remote import RemoteOptions, RemoteReader, clear_memo  # noqa: E402
from olmo_data.remote import reader as reader_module  # noqa: E402
from tests.flaky_server import Faults, FlakyServer  # noqa: E402

INSTANCE = 8192


def make_metadata(path: Path, n: int, seed: int) -> int:
    """A tokenize-like `.csv.gz` of n documents (lengths ~ log-normal around 1,000 tokens, 32-hex ids, 40
    source files named as dolma's are); returns the token count."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(6.5, 1.0, n).astype(np.int64))
    ends = np.cumsum(lengths)
    ids = [f"{x:032x}" for x in rng.integers(0, 2**63, n, dtype=np.int64).tolist()]
    srcs = np.array([f"s3://ai2-llm/pretraining-data/sources/dclm/shard-{k:04d}.jsonl.zst" for k in range(40)])
    table = pa.table(
        {
            "start": ends - lengths,
            "end": ends,
            "id": ids,
            "src": srcs[rng.integers(0, 40, n)],
            "loc": rng.integers(1, 200_000, n),
        }
    )
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    with gzip.open(path, "wb", compresslevel=6) as f:
        pacsv.write_csv(table, f, options)
    return int(ends[-1])


def fresh_process() -> None:
    """What a new command starts with: no reader (pool, range cache, counters), no sizes memo."""
    reader_module._READER = RemoteReader(RemoteOptions.from_env())
    clear_memo()


def call(
    server: FlakyServer, cache: str, items: list[tuple[str, None, int, int]], ranged: bool = True
) -> dict[str, Any]:
    """One batch's document lookups: `prepare` with every file's range (or files only: each lookup then reads its
    own block and ids, in turn), then the lookups."""
    fresh_process()
    requests, heads, sent = server.requests, server.heads, server.bytes_sent
    began = time.perf_counter()
    docs = DocIndex(cache)
    docs.prepare(items if ranged else [(u, m) for u, m, _, _ in items])
    answers = [docs.lookup(u, a, b) for u, _, a, b in items]
    return {
        "s": time.perf_counter() - began,
        "requests": server.requests - requests,
        "heads": server.heads - heads,
        "bytes": server.bytes_sent - sent,
        "built": docs.built,
        "answers": answers,
        "documents": sum(len(a or []) for a in answers),
    }


def find_id(server: FlakyServer, cache: str, urls: list[str], doc_id: str) -> dict[str, Any]:
    """The files holding document `doc_id`: every file's index opened (heads cached), then its hashes searched."""
    fresh_process()
    requests, heads, sent = server.requests, server.heads, server.bytes_sent
    began = time.perf_counter()
    docs = DocIndex(cache)
    docs.prepare([(u, None) for u in urls])
    indexes = [docs.index_for(u) for u in urls]
    rows = docs.rows_with_ids([i for i in indexes if i is not None], [doc_id])
    return {
        "s": time.perf_counter() - began,
        "requests": server.requests - requests,
        "heads": server.heads - heads,
        "bytes": server.bytes_sent - sent,
        "found": sum(bool(r) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--big-files", type=int, default=4)
    parser.add_argument("--big-docs", type=int, default=1_500_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--fallback-files", type=int, default=20)
    parser.add_argument("--sample-every", type=int, default=1024)
    parser.add_argument("--unprepared-files", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        os.environ["OLMO_DATA_CACHE"] = str(Path(work) / "cache")
        os.environ["OLMO_DATA_SIZE_CACHE"] = "1"
        www, made = Path(work) / "www", Path(work) / "made"
        made.mkdir()
        variants: dict[str, tuple[int, int, float, int, Any]] = {}
        for name, n in (("small", args.docs), ("big", args.big_docs)):
            if name == "big" and not args.big_files:
                continue
            meta = made / f"{name}.csv.gz"
            tokens = make_metadata(meta, n, seed=len(variants))
            began = time.process_time()
            head = write_index_file(str(meta), made / f"{name}.docs.idx", args.sample_every)
            variants[name] = (n, tokens, time.process_time() - began, meta.stat().st_size, head)
        for folder in ("tok", "bare"):
            (www / folder).mkdir(parents=True)
        big = set(random.Random(0).sample(range(args.files), args.big_files))
        rng = random.Random(1)
        items: list[tuple[str, int]] = []
        bare: list[tuple[str, int]] = []
        for i in range(args.files):
            name = "big" if i in big else "small"
            stem = f"part-{i:05d}"
            os.link(made / f"{name}.csv.gz", www / "tok" / f"{stem}.csv.gz")
            os.link(made / f"{name}.docs.idx", www / "tok" / f"{stem}.docs.idx")
            start = rng.randrange(0, variants[name][1] - INSTANCE)
            items.append((f"tok/{stem}.npy", start))
            if len(bare) < args.fallback_files and name == "small":
                os.link(made / f"{name}.csv.gz", www / "bare" / f"{stem}.csv.gz")
                bare.append((f"bare/{stem}.npy", start))
        with FlakyServer(www, Faults(latency_s=args.latency)) as server:
            batch = [(f"{server.url}/{p}", None, s, s + INSTANCE) for p, s in items]
            cache = str(Path(work) / "cache")
            first = call(server, cache, batch)
            again = call(server, cache, batch)
            other = call(server, cache, [(u, None, a + INSTANCE, b + INSTANCE) for u, _, a, b in batch])
            shifted = [(u, None, a + 2 * INSTANCE, b + 2 * INSTANCE) for u, _, a, b in batch]
            unprepared = call(server, cache, shifted[: args.unprepared_files], ranged=False)
            big_index = RangeFileIndex(variants["big"][4], str(made / "big.docs.idx"))
            wanted = big_index.doc(variants["big"][0] // 2)[0]
            by_id = find_id(server, cache, [u for u, _, _, _ in batch], wanted)
            assert by_id["found"] == args.big_files, by_id
            subset = [(f"{server.url}/{p}", None, s, s + INSTANCE) for p, s in bare]
            fallback = call(server, cache, subset)
            fallback_again = call(server, cache, subset)
        assert first["built"] == 0 and again["answers"] == first["answers"]
        in_bare = {p.replace("bare/", "tok/") for p, _ in bare}
        mine = [a for (p, _), a in zip(items, first["answers"], strict=True) if p in in_bare]
        assert fallback["answers"] == mine, "the index and the fallback disagree"
        scale = args.files / max(1, len(subset))
        print(f"{args.files} remote token files at {args.latency * 1000:g} ms a request, one {INSTANCE}-token range "
              f"each ({first['documents']} documents found); {args.files - args.big_files} files of {args.docs:,} "
              f"documents, {args.big_files} of {args.big_docs:,}\n")  # fmt: skip
        print("| index file | documents | .csv.gz | .docs.idx | head | build (CPU) |")
        print("|---|---|---|---|---|---|")
        for name, (n, _, build_s, gz, head) in variants.items():
            print(f"| {name} | {n:,} | {gz / 1e6:.1f} MB | {head.file_size / 1e6:.1f} MB | {head.head_size / 1e3:.1f} "
                  f"KB | {build_s:.1f} s |")  # fmt: skip
        print("\n| lookups of one batch | seconds | requests (HEAD) | bytes received |")
        print("|---|---|---|---|")
        for label, r, k in (
            ("index file, first call (empty caches)", first, 1.0),
            ("index file, repeated call (a later command, the same batch)", again, 1.0),
            ("index file, another batch (a later command: heads and sizes cached)", other, 1.0),
            (
                f"index file, another batch, prepared without ranges (scaled from {args.unprepared_files})",
                unprepared,
                args.files / max(1, args.unprepared_files),
            ),
            (f"index file, a document by id (found in {by_id['found']} files)", by_id, 1.0),
            (f"fallback, first call (scaled from {len(subset)} small files)", fallback, scale),
            (f"fallback, repeated call (scaled from {len(subset)} small files)", fallback_again, scale),
        ):
            print(f"| {label} | {r['s'] * k:.2f} | {r['requests'] * k:.0f} ({r['heads'] * k:.0f}) | "
                  f"{r['bytes'] * k / 1e6:.1f} MB |")  # fmt: skip


if __name__ == "__main__":
    main()
