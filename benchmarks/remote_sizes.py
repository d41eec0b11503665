"""Benchmark: sizing N remote token files at L seconds a round trip, one HEAD at a time (what every command did before
`olmo_data.remote.sizes`), concurrently (`concurrency` at a time), and from the disk cache (a later command).

The files are tiny and served by `tests/flaky_server.py` on loopback with `--latency` added to every request; only
the round trips are measured, as a store's would be. Each mode runs in a fresh memo (a fresh process, as far as
sizing goes); the sequential mode is timed over `--sequential-files` files and scaled to N (it is linear).

    python benchmarks/remote_sizes.py [--files 4000] [--latency 0.05] [--concurrency 64] [--sequential-files 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from olmo_data.io import file_sizes  # noqa: E402
from olmo_data.remote import RemoteOptions, RemoteReader, clear_memo  # noqa: E402
from olmo_data.remote import reader as reader_module  # noqa: E402
from tests.flaky_server import Faults, FlakyServer  # noqa: E402


def timed(urls: list[str], concurrency: int) -> float:
    reader_module._READER = RemoteReader(RemoteOptions(concurrency=concurrency))
    clear_memo()
    began = time.perf_counter()
    file_sizes(urls, progress=False)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sequential-files", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        os.environ["OLMO_DATA_CACHE"] = str(Path(work) / "cache")
        os.environ["OLMO_DATA_SIZE_CACHE"] = "0"
        root = Path(work) / "www" / "tok"
        root.mkdir(parents=True)
        for i in range(args.files):
            (root / f"part-{i:05d}.npy").write_bytes(b"\0" * (4 * (i % 97 + 1)))
        with FlakyServer(root.parent, Faults(latency_s=args.latency)) as server:
            urls = [f"{server.url}/tok/part-{i:05d}.npy" for i in range(args.files)]
            sequential = timed(urls[: args.sequential_files], 1) * args.files / args.sequential_files
            heads = server.heads
            concurrent = timed(urls, args.concurrency)
            peak = server.max_in_flight
            os.environ["OLMO_DATA_SIZE_CACHE"] = "1"
            first = timed(urls, args.concurrency)  # fills the disk cache (same cost as `concurrent`)
            before = server.heads
            cached = timed(urls, args.concurrency)
            print(f"| {args.files} files at {args.latency * 1000:g} ms | seconds | HEAD requests |")
            print("|---|---|---|")
            print(f"| one at a time (scaled from {args.sequential_files}) | {sequential:.1f} | {heads} of them |")
            print(f"| concurrent ({args.concurrency}; {peak} in flight seen) | {concurrent:.2f} | {args.files} |")
            print(f"| concurrent, writing the cache | {first:.2f} | {args.files} |")
            print(f"| cached (a later command) | {cached:.3f} | {server.heads - before} |")


if __name__ == "__main__":
    main()
