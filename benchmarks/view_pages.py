"""How long `olmo-data view` takes to answer each page of a run, over HTTP on loopback, as a browser asks.

Opens the run as the command does (`RunAnswers`, then `warm`: spikes, lineage, data statistics), serves it, and
asks each page once cold (a step or a text never asked before) and then `--repeats` times (median). The text traced
is a passage of a document of the run's own data between words of its own (so it has one span), the document the
same one's id; the step pages are a spike's (the first, if any) and a plain step.

    python benchmarks/view_pages.py runs/tiny
    python benchmarks/view_pages.py runs/tiny --window 5 --z 2 --step 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from urllib.parse import quote

from olmo_view import RunAnswers, ViewServer


def ask(url: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as r:
        body = r.read()
    return time.perf_counter() - t0, r.status, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--z", type=float, default=3.0)
    parser.add_argument("--step", type=int, default=40, help="a plain step to open")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    t0 = time.perf_counter()
    answers = RunAnswers(args.run, window=args.window, z=args.z)
    t1 = time.perf_counter()
    answers.warm()
    t2 = time.perf_counter()
    spikes = [s.step for s in answers.spikes().spikes]
    print(f"{args.run}: opened in {t1 - t0:.2f} s, warmed (spikes, lineage, stats) in {t2 - t1:.2f} s; spikes {spikes}")
    source = answers.source
    f = source.files[0]
    ids = source.read_tokens(f.path, f.dtype, 1000, 60).tolist()  # a passage of the data itself
    text = "Words of my own first. " + answers.tokenizer().decode(ids) + " and an ending of mine."
    doc = answers.step(args.step + 1).report.instances[0].documents or []  # another step than the one timed
    server = ViewServer(answers)
    server.start()
    base = server.url.rstrip("/")
    pages = ["/", f"/step/{args.step}", f"/step/{args.step}?sort=loss&page=2", f"/step/{args.step + 2}", "/stages"]
    pages += [f"/step/{spikes[0]}?sort=excess"] if spikes else []
    pages += ["/trace", "/trace?text=" + quote(text)] + (["/document?id=" + quote(doc[0].id)] if doc else [])
    print(f"{'page':<44} {'first (s)':>9} {'again (s)':>9} {'bytes':>9}")
    for page in pages:
        first, status, size = ask(base + page)
        again = statistics.median(ask(base + page)[0] for _ in range(args.repeats))
        if status != 200:
            sys.exit(f"{page}: status {status}")
        print(f"{page[:44]:<44} {first:9.3f} {again:9.3f} {size:9,}")
    server.shutdown()


if __name__ == "__main__":
    main()
