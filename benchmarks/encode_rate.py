"""In-memory batch encode rate of each tokenizer backend: the ceiling for `olmo-data tokenize`.

Encodes the standard-library demo corpus (about 11 MB of real text: the documents `make_demo_corpus` writes,
read straight from the modules) in batches with HF `tokenizers` and with the riptoken (where installed) and tiktoken
backends, in one process, and prints M tokens/s for each. All run with the same number of threads (default 1, as in
each worker of `olmo-data tokenize --processes N`); the script checks that they give the same ids meanwhile.

    python benchmarks/encode_rate.py                       # gpt2, cl100k_base, gpt-neox-20b from ../shared
    python benchmarks/encode_rate.py --threads 2 --tokenizer path/to/tokenizer.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"
DEFAULT_TOKENIZERS = [str(SHARED / n) for n in ("gpt2.json", "cl100k_base.json", "gpt-neox-20b.json")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", action="append", help="tokenizer.json path (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="threads per backend (default 1)")
    parser.add_argument("--batch-size", type=int, default=128, help="documents per encode_batch call")
    parser.add_argument("--repeat", type=int, default=1, help="passes over the corpus (best one is reported)")
    args = parser.parse_args()
    # Must be set before `tokenizers` starts its thread pool.
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.threads > 1 else "false"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    from olmo_data.demo import stdlib_sources
    from olmo_data.tokenizer import load_tokenizer
    from olmo_data.tokenizer.engines import available

    texts = []
    for path in stdlib_sources():
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    mb = sum(len(t.encode()) for t in texts) / 1e6
    batches = [texts[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# {len(texts)} documents, {mb:.1f} MB; batch {args.batch_size}; threads {args.threads}; {machine}")
    print(f"{'tokenizer':<22} {'backend':<9} {'load s':>7} {'tokens':>11} ", end="")
    print(f"{'encode s':>9} {'M tok/s':>8} {'MB/s':>6}")
    for spec in args.tokenizer or DEFAULT_TOKENIZERS:
        reference: list[list[int]] | None = None
        for backend in ("hf", *(e for e in ("riptoken", "tiktoken") if available(e))):
            start = time.perf_counter()
            tok = load_tokenizer(spec, backend)  # type: ignore[arg-type]
            load_s = time.perf_counter() - start
            tok.set_num_threads(args.threads)
            tok.encode_batch(texts[:8])  # warm-up
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                out = [ids for batch in batches for ids in tok.encode_batch(batch)]
                best = min(best, time.perf_counter() - start)
            tokens = sum(map(len, out))
            if reference is None:
                reference = out
            elif out != reference:
                print(f"!! {tok.name}: {backend} ids differ from hf", file=sys.stderr)
            print(
                f"{tok.name:<22} {tok.backend:<9} {load_s:7.2f} {tokens:11,} {best:9.2f} "
                f"{tokens / best / 1e6:8.2f} {mb / best:6.1f}"
            )


if __name__ == "__main__":
    main()
