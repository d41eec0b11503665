"""Where a tokenize worker's CPU goes, stage by stage, and the ceiling that puts on the encode phase.

`olmo-data tokenize --processes N` keeps N cores busy, and on each core a worker reads (gunzip, JSON, the depth
check, strip), encodes (our encoder on the engine, BOS/EOS added) and writes (the .npy and its .csv.gz) its inputs.
However those overlap, the cores must do all of it, so the encode phase (the run less its start-up) cannot take less
wall time than (read + encode + write) CPU seconds / N, and its rate cannot pass

    ceiling = raw CPU s / (read + encode + write CPU s)

of the engine's raw rate x N (raw: the engine's bare batch call on the same batches, as
`tokenize_throughput.py` times it). This script measures each term on a corpus of any size.

Each worker share (the inputs a worker takes, `files[i::N]`) is run in fresh spawned processes, one at a time:
  stages  the share streamed as a worker streams it (one batch read, encoded, written, dropped), serially, with the
          CPU seconds of each stage summed (`time.process_time`, this process only)
  raw     the share read into memory (untimed), then the engine's bare call on those batches, first pass (fastokens'
          piece cache outlives its engine, so a second pass over the same texts would be faster than any run's)
Each figure is the best of --repeat fresh processes (the least disturbed; stages and raw take turns), summed over
the shares.

    python benchmarks/tokenize_cpu_split.py --mb 300 --processes 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tokenizers"


def _share(args: tuple[str, list[str], str, str]) -> dict[str, float]:
    """One share's CPU seconds by stage (`mode` "stages") or its bare engine call (`mode` "raw"), in this process."""
    spec, files, mode, dest = args
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    import isal.igzip  # noqa: F401  (imported before the clock starts, as a worker has them after its first input)
    import msgspec  # noqa: F401
    import numpy  # noqa: F401

    from olmo_data.dataset import smallest_dtype
    from olmo_data.tokenize import workers
    from olmo_data.tokenize.options import TYPECODES, TokenizeOptions
    from olmo_data.tokenize.parts import PartWriter
    from olmo_data.tokenize.reading import InputReader
    from olmo_data.tokenizer import load_tokenizer
    from olmo_data.tokenizer.engines import build_piece_encoder

    tok = load_tokenizer(spec)
    tok.ready()
    tok.set_num_threads(1)
    opts = TokenizeOptions(tokenizer=spec)
    dtype = smallest_dtype(tok.vocab_size)  # (as tokenize chooses it)
    typecode, eos = TYPECODES[dtype], tok.eos_token_id
    if mode == "raw":
        batches = [b.texts for f in files for b in InputReader.open(f, opts).batches()]
        if tok.backend == "quicktok":  # its bare batch call, as tokenize_throughput.py's raw column
            encode = build_piece_encoder("quicktok", "raw", tok._encode_batch.plan)  # type: ignore[attr-defined]
            call: Any = lambda b: encode.flat(b, 1)  # noqa: E731
        elif tok.backend == "fastokens":  # it runs the tokenizer.json whole: our encode_flat is its bare call
            call = tok.encode_flat
        else:
            return {"raw": float("nan"), "tokens": 0}
        c0 = time.process_time()
        tokens = sum(len(call(b)[0]) for b in batches)
        return {"raw": time.process_time() - c0, "tokens": tokens, "engine": tok.backend}  # type: ignore[dict-item]
    spent = {"read": 0.0, "encode": 0.0, "write": 0.0, "tokens": 0}
    for index, path in enumerate(files):
        writer = PartWriter(Path(dest), index, dtype, opts.max_tokens_per_file)
        stream = InputReader.open(path, opts).batches()
        while True:
            c0 = time.process_time()
            batch = next(stream, None)
            c1 = time.process_time()
            spent["read"] += c1 - c0
            if batch is None:
                break
            flat, lengths = workers._encode(tok, batch.texts, eos, None, typecode)
            c2 = time.process_time()
            writer.write(flat, lengths, batch.docs, path)
            spent["encode"] += c2 - c1
            spent["write"] += time.process_time() - c2
            spent["tokens"] += len(flat)
        c0 = time.process_time()
        writer.close_part()
        spent["write"] += time.process_time() - c0
    return spent


def _fresh(args: tuple[str, list[str], str, str]) -> dict[str, float]:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_share, (args,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=300, help="corpus size in MB of text")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2, help="worker shares (a run's --processes)")
    parser.add_argument("--tokenizer", action="append", help="tokenizer.json (repeatable; default: ../shared ones)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per figure; the best counts")
    args = parser.parse_args()
    from tokenize_throughput import build_corpus

    specs = args.tokenizer or [str(SHARED / n) for n in ("gpt2.json", "cl100k_base.json", "gpt-neox-20b.json")]
    with tempfile.TemporaryDirectory() as tmp_str:
        tmp = Path(tmp_str)
        (tmp / "docs").mkdir()
        files = build_corpus(tmp / "docs", args.mb, args.shards)
        print(f"# corpus: {len(files)} shards, {args.mb:.0f} MB of text; {args.processes} shares; CPU seconds")
        print(
            f"{'tokenizer':<18} {'engine':>9} {'tokens':>12} {'read s':>7} {'encode s':>8} {'write s':>7} "
            f"{'raw s':>6} {'encode %':>8} {'ceiling %':>9}"
        )
        for spec in specs:
            totals: dict[str, float] = {"read": 0, "encode": 0, "write": 0, "raw": 0, "tokens": 0}
            engine = "-"
            for i in range(args.processes):
                share = files[i :: args.processes]
                out = tmp / f"out-{i}"
                out.mkdir(exist_ok=True)
                stages, raws = [], []
                for _ in range(args.repeat):  # taking turns, so that a disturbance of the machine hits both alike
                    stages.append(_fresh((spec, share, "stages", str(out))))
                    raws.append(_fresh((spec, share, "raw", str(out))))
                for key in ("read", "encode", "write"):
                    totals[key] += min(s[key] for s in stages)
                totals["raw"] += min(r["raw"] for r in raws)
                totals["tokens"] += stages[0]["tokens"]
                engine = str(raws[0].get("engine", "-"))
            work = totals["read"] + totals["encode"] + totals["write"]
            print(
                f"{Path(spec).name:<18} {engine:>9} {int(totals['tokens']):>12,} {totals['read']:>7.2f} "
                f"{totals['encode']:>8.2f} {totals['write']:>7.2f} {totals['raw']:>6.2f} "
                f"{100 * totals['encode'] / work:>7.0f}% {100 * totals['raw'] / work:>8.0f}%",
                flush=True,
            )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    main()
