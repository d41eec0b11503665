"""End-to-end `olmo-data tokenize` throughput against each engine's raw rate, `dolma tokens` and datatrove, in one run.

For each tokenizer, on the same corpus and process count, it measures:
  raw       each engine's own in-memory rate x processes: N processes each encode their share of documents already
            in memory with the engine's bare call (quicktok `encode_batch(texts, 1)` and fastokens
            `encode_batch_flat(texts)` (through our `flat`: ids as numpy, no lists) on batches of 512, riptoken
            `CoreBPE.encode_ordinary`, tiktoken `encode_ordinary`, HF `tokenizers` `encode_batch_fast` on one
            thread), on the text that engine is given (GPT-NeoX-20B: with its space pairs); aggregate tokens /
            slowest worker's time; nan where the engine cannot run the tokenizer (quicktok: cl100k's regex only);
            fastokens (and the encoder on it) on the first pass of fresh processes, as its piece cache outlives
            the engine and makes passes over texts seen before faster than any tokenize run
  encoder   the same with our encoder (`Tokenizer.encode_batch`: added tokens, NFC, the long-piece guard; on
            quicktok `encode_flat`, the tokenize stage's batch path)
  ours      `olmo-data tokenize --processes N` as a user runs it (a subprocess, start-up included), with the
            tokenizer's checked plan cached from an earlier run; `cold`: the first run, cache empty; `% raw`: ours
            against the raw rate of the engine auto chose; `start s`: the same command on one short document (its
            start-up; `start cpu`: its CPU seconds, all processes, steadier than its wall time on a shared machine);
            `phase %`: ours less that start-up, against the raw rate; also `--backend tiktoken`
  dolma     `dolma tokens --processes N` on the same files, when a `dolma` executable is given (its own venv)
  datatrove datatrove's `DocumentTokenizer` (HF `tokenizers`' encode_batch) with N tasks, when a Python with
            datatrove installed is given (its own venv; it reads the same .jsonl.gz files)
and whether our documents' tokens equal dolma's (by document id); `cpu`: CPU seconds (user + system) of all
processes of our run (the best one) and of dolma's, and their ratio; `raw/cpu`: the chosen engine's tokens a CPU
second in memory, `ours/cpu` our run's less its start-up's CPU seconds, `cpu %` the one against the other (the
encode phase against the engine's rate, per core: less disturbed by other work). Ours are the best of --repeat
runs (the machine may be shared; the best run is the least disturbed one); dolma and datatrove run once each.

The corpus is real text: Python sources (standard library, tests included) as dolma .jsonl.gz shards.

dolma and datatrove each in its own venv (dolma 1.2.1 pins tokenizers<=0.19.1 and numpy<2; its s3fs/boto3 pins send
pip backtracking for many minutes, and local files need neither):
    python3 -m venv /tmp/dolmavenv && /tmp/dolmavenv/bin/pip install --no-deps dolma==1.2.1 && /tmp/dolmavenv/bin/pip \\
        install "numpy<2" "tokenizers<=0.19.1" anyascii blingfire charset-normalizer fasttext-wheel fsspec jq \\
        jsonpath-ng msgspec necessary nltk omegaconf platformdirs python-dotenv pyyaml requests rich smart-open \\
        tqdm uniseg zstandard
    python3 -m venv /tmp/dtvenv && /tmp/dtvenv/bin/pip install datatrove orjson tokenizers  # (its tokenizer needs it)

    python benchmarks/tokenize_throughput.py --mb 30 --processes 2 --dolma /tmp/dolmavenv/bin/dolma \
        --datatrove-python /tmp/dtvenv/bin/python
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tokenizers"


def build_corpus(dest: Path, megabytes: float, shards: int) -> list[str]:
    """Python sources as dolma documents, dealt round-robin into `shards` .jsonl.gz files, up to `megabytes`.

    The standard library first (about 30 MB), then installed packages' sources (numpy, torch, ...) if more is asked.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    files += sorted(purelib.rglob("*.py"))
    lines: list[list[str]] = [[] for _ in range(shards)]
    total = 0
    for i, path in enumerate(files):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        doc = {"id": str(path), "text": text, "source": "python"}
        lines[i % shards].append(json.dumps(doc))
        total += len(text.encode())
        if total >= megabytes * 1e6:
            break
    out = []
    for k, shard in enumerate(lines):
        path = dest / f"shard-{k:03d}.jsonl.gz"
        path.write_bytes(gzip.compress(("\n".join(shard) + "\n").encode(), compresslevel=6))
        out.append(str(path))
    return out


def _encode_share(args: tuple[str, list[str], list[str], int, Any]) -> dict[str, tuple[int, float, float]]:
    """One worker's share, encoded in memory by each of `modes` (an engine's bare call, or our encoder), the modes
    taking turns `repeat` times (so that a disturbance of the machine hits them alike); the best time of each."""
    spec, modes, files, repeat, barrier = args
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    import unicodedata

    from olmo_data.documents import read_documents
    from olmo_data.errors import DataError
    from olmo_data.tokenizer import load_tokenizer
    from olmo_data.tokenizer.engines import build_piece_encoder
    from olmo_data.tokenizer.tiktoken_plan import PAIR

    texts = [d.text.strip() for f in files for d in read_documents(f)]
    batches = [texts[i : i + 512] for i in range(0, len(texts), 512)]
    runs: dict[str, Any] = {}
    # fastokens keeps a cache of the pieces it has encoded, which outlives the engine: each of its passes is made on
    # an engine loaded again (untimed), and `in_memory` gives it one pass a process, so that no pass sees texts the
    # process has encoded before (a tokenize run sees each document once)
    remake: dict[str, Any] = {}

    def on_fresh_fastokens() -> Any:
        tok = load_tokenizer(spec, "fastokens")
        tok.ready()
        return lambda: sum(len(tok.encode_flat(b)[0]) for b in batches)  # type: ignore[index]

    for mode in modes:
        if mode == "encoder" and load_tokenizer(spec).backend == "fastokens":
            remake[mode] = on_fresh_fastokens
        elif mode == "encoder":
            tok = load_tokenizer(spec)
            if tok.encode_flat(texts[:1]) is not None:  # the engine's batch call (quicktok): what tokenize runs
                runs[mode] = lambda tok=tok: sum(len(tok.encode_flat(b)[0]) for b in batches)  # type: ignore[index]
            else:
                runs[mode] = lambda tok=tok: sum(len(ids) for b in batches for ids in tok.encode_batch(b))
        elif mode == "fastokens":  # its batch call, on the batches tokenize gives it (the whole tokenizer.json)
            try:
                load_tokenizer(spec, "fastokens")
            except DataError:  # a vocabulary it refuses (cl100k's, with a gap in its ids)
                continue
            remake[mode] = on_fresh_fastokens
        elif mode == "hf":
            hf = load_tokenizer(spec, "hf").hf
            runs[mode] = lambda hf=hf: sum(
                len(e.ids) for b in batches for e in hf.encode_batch_fast(b, add_special_tokens=False)
            )
        else:
            try:
                plan = load_tokenizer(spec, mode)._encode_batch.plan  # type: ignore[arg-type]
            except DataError:  # an engine that cannot run this tokenizer (quicktok on GPT-2's regex)
                continue
            seen = texts
            if plan.space_pairs:
                seen = [unicodedata.normalize("NFC", t).replace("  ", PAIR) for t in texts]
            # riptoken's call with its long-piece guard (texts that may hold a piece of 500+ bytes go to tiktoken):
            # bare, it is both inexact and slow on those pieces
            encode = build_piece_encoder(mode, "raw", plan)  # type: ignore[arg-type]
            if mode == "quicktok":  # its batch call, on the batches tokenize gives it
                runs[mode] = lambda encode=encode: sum(len(encode.flat(b, 1)[0]) for b in batches)  # type: ignore
            else:
                runs[mode] = lambda encode=encode, seen=seen: sum(len(encode(t)) for t in seen)
    best: dict[str, tuple[int, float, float]] = {}
    barrier.wait()
    for _ in range(repeat):
        for mode in modes:
            if mode not in runs and mode not in remake:
                continue
            run = remake[mode]() if mode in remake else runs[mode]
            t0, c0 = time.perf_counter(), time.process_time()
            n = run()
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            if mode not in best or dt < best[mode][1]:
                best[mode] = (n, dt, min(cpu, best.get(mode, (0, 0, cpu))[2]))
            else:
                best[mode] = (*best[mode][:2], min(cpu, best[mode][2]))
    return best


def _pool(spec: str, modes: list[str], files: list[str], processes: int, repeat: int) -> list[dict[str, Any]]:
    """Each worker's `_encode_share` result, its share of `files` encoded by `modes` in freshly spawned processes."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(processes)
        shares = [(spec, modes, files[i::processes], repeat, barrier) for i in range(processes)]
        with ctx.Pool(processes) as pool:
            return pool.map(_encode_share, shares)


def _rates(results: list[dict[str, Any]], modes: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    ran = [m for m in modes if all(m in r for r in results)]
    wall = {m: sum(r[m][0] for r in results) / max(r[m][1] for r in results) / 1e6 for m in ran}
    cpu = {m: sum(r[m][0] for r in results) / sum(r[m][2] for r in results) / 1e6 for m in ran}
    return wall, cpu


def in_memory(
    spec: str, modes: list[str], files: list[str], processes: int, repeat: int, cold: tuple[str, ...] = ()
) -> tuple[dict[str, float], dict[str, float]]:
    """M tokens/s of each mode, all processes together: aggregate tokens / the slowest worker's best time; and
    M tokens per CPU second (a core's rate, less disturbed by other work on the machine).

    The modes in `cold` (those on fastokens) are timed on their first pass in processes of their own, `repeat`
    times: fastokens keeps the pieces it has encoded in a cache that outlives the engine, so an engine loaded again
    in the same process encodes texts seen before ~1.5x faster on GPT-2 (measured: 0.142 and 0.129 CPU s for the two
    halves of the corpus, then 0.089 and 0.085 for each again, on engines loaded afresh), which a tokenize run,
    seeing each document once, never gets."""
    wall, cpu = _rates(_pool(spec, [m for m in modes if m not in cold], files, processes, repeat), modes)
    for mode in cold:
        for _ in range(repeat):
            w, c = _rates(_pool(spec, [mode], files, processes, 1), [mode])
            if mode in w:
                wall[mode], cpu[mode] = max(wall.get(mode, 0.0), w[mode]), max(cpu.get(mode, 0.0), c[mode])
    nan = {m: float("nan") for m in modes if m not in wall}
    return wall | nan, cpu | nan


_DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
src, dest, spec, eos, tasks, logs = sys.argv[1:7]
LocalPipelineExecutor(
    pipeline=[
        JsonlReader(src, glob_pattern="*.jsonl.gz"),
        DocumentTokenizer(dest, tokenizer_name_or_path=spec, eos_token=eos, shuffle_documents=False),
    ],
    tasks=int(tasks), workers=int(tasks), logging_dir=logs,
).run()
"""


def documents_of(dest: Path, dtype: str) -> dict[str, bytes]:
    """Document id -> its tokens' bytes, from the .npy / .csv.gz pairs of a token directory (ours or dolma's)."""
    import csv

    import numpy as np

    out = {}
    for npy in sorted(dest.rglob("*.npy")):
        tokens = np.fromfile(npy, dtype=dtype)
        meta = npy.with_suffix(".csv.gz")
        with gzip.open(meta, "rt", newline="") as fh:
            for start, end, doc_id, *_ in csv.reader(fh):
                out[doc_id] = tokens[int(start) : int(end)].tobytes()
    return out


_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(time.perf_counter() - t0, r.ru_maxrss, r.ru_utime + r.ru_stime)\n"
)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """Wall seconds of a command, the largest peak RSS (MiB) of any one of its processes, and the CPU seconds of all
    of them (user + system: less disturbed than wall time by other work on a shared machine).

    Measured from a fresh wrapper process, so that nothing else this script ran counts in the peak.
    """
    out = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], check=True, capture_output=True, text=True, env=env)
    wall, kib, cpu = out.stdout.split()
    return float(wall), int(kib) // 1024, float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=30, help="corpus size in MB of text")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tokenizer", action="append", help="tokenizer.json (repeatable; default: ../shared ones)")
    parser.add_argument("--dolma", default=shutil.which("dolma"), help="path of the `dolma` executable")
    parser.add_argument("--datatrove-python", help="a Python with datatrove installed (its own venv)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of ours; the best counts")
    parser.add_argument("--engines", default="quicktok,fastokens,riptoken,tiktoken,hf", help="raw rates measured")
    args = parser.parse_args()
    specs = args.tokenizer or [str(SHARED / n) for n in ("gpt2.json", "cl100k_base.json", "gpt-neox-20b.json")]
    olmo_data_cli = [sys.executable, "-m", "olmo_cli.main"]
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory() as tmp_str:
        tmp = Path(tmp_str)
        (tmp / "docs").mkdir()
        files = build_corpus(tmp / "docs", args.mb, args.shards)
        tiny = [tmp / f"tiny-{i}.jsonl" for i in range(args.processes)]  # one per process: the pool starts too
        for i, path in enumerate(tiny):
            path.write_text(json.dumps({"id": f"tiny-{i}", "text": "Hello, world."}) + "\n")
        mb = sum(len(line) for f in files for line in gzip.open(f)) / 1e6
        print(f"# corpus: {len(files)} shards, {mb:.1f} MB of JSON lines; processes {args.processes}")
        print(f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
        print(f"# load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work slows it)")
        print(f"# dolma: {args.dolma or 'not given'}; datatrove: {args.datatrove_python or 'not given'}")
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # a stale .pyc is then compiled again at every start-up
            print("# PYTHONDONTWRITEBYTECODE is set: start-up includes compiling modules edited since their .pyc")
        print("# M/s: million tokens a second, all processes together; x: dolma's (datatrove's) seconds / ours")
        raw_heads = " ".join(f"{'raw ' + e:>12}" for e in engines)
        print(
            f"{'tokenizer':<18} {'tokens':>10} {raw_heads} {'encoder':>8} {'engine':>8} {'cold s':>6} {'ours s':>6} "
            f"{'ours M/s':>8} {'% raw':>5} {'start s':>7} {'start cpu':>9} {'phase %':>7} {'tiktok s':>8} "
            f"{'dolma s':>7} {'x':>5} "
            f"{'same':>4} {'dtrove s':>8} {'x':>5} {'cpu s':>6} {'dolma cpu':>9} {'cpu x':>6} {'raw/cpu':>7} "
            f"{'ours/cpu':>8} {'cpu %':>5}"
        )
        for spec in specs:
            on_fastokens = ("fastokens", *(["encoder"] if _auto_engine(spec, dict(os.environ)) == "fastokens" else []))
            rates, per_cpu = in_memory(spec, [*engines, "encoder"], files, args.processes, args.repeat, on_fastokens)
            raws = {e: rates[e] for e in engines}
            encoder_rate = rates["encoder"]
            out = tmp / "ours"
            cache = dict(os.environ, OLMO_DATA_CACHE=str(tmp / f"cache-{Path(spec).stem}"))

            cpus: dict[str, list[float]] = {"auto": [], "tiktoken": []}

            def ours(
                backend: str,
                spec: str = spec,
                out: Path = out,
                cache: dict[str, str] = cache,
                inputs: Any = files,
                cpus: dict[str, list[float]] = cpus,
            ) -> float:
                cmd = [*olmo_data_cli, "tokenize", "-t", spec, "--destination", str(out), "--no-progress"]
                cmd += ["--processes", str(args.processes), "--backend", backend, "-d", *inputs]
                shutil.rmtree(out, ignore_errors=True)
                wall, _, cpu = timed(cmd, env=cache)
                cpus[backend].append(cpu)
                return wall

            # cold: an empty cache, so the tokenizer is checked against `tokenizers` at start-up (first use of a
            # tokenizer file); warm: the checked plan is cached, as on every later run
            cold_s = ours("auto")
            cpus["auto"].clear()
            ours_s = min(ours("auto") for _ in range(args.repeat))
            ours_cpu = min(cpus["auto"])
            manifest = json.loads((out / "manifest.json").read_text())
            ours_tokens, dtype = manifest["totals"]["tokens"], manifest["dtype"]
            auto = _auto_engine(spec, cache)
            chosen = auto if auto in raws and auto != "hf" else "tiktoken"
            ours_docs = documents_of(out, dtype)
            # start-up: the same command on one short document a process (interpreter, imports, cached plan, pool)
            cpus["auto"].clear()
            start_s = min(ours("auto", inputs=tiny) for _ in range(args.repeat))
            start_cpu = min(cpus["auto"])
            tiktoken_s = min(ours("tiktoken") for _ in range(args.repeat))
            dolma_s, dolma_cpu, same = float("nan"), float("nan"), "-"
            if args.dolma:
                eos = manifest["eos_token_id"]
                dcmd = [args.dolma, "tokens", "--documents", *files, "--destination", str(tmp / "dolma")]
                dcmd += ["--tokenizer.name_or_path", spec, "--tokenizer.eos_token_id", str(eos)]
                dcmd += ["--processes", str(args.processes), "--dtype", dtype]
                dolma_s, _, dolma_cpu = timed(dcmd)
                same = "yes" if documents_of(tmp / "dolma", dtype) == ours_docs else "NO"
                shutil.rmtree(tmp / "dolma", ignore_errors=True)
            datatrove_s = float("nan")
            if args.datatrove_python:
                from tokenizers import Tokenizer as HFTokenizer

                eos_text = HFTokenizer.from_file(spec).id_to_token(manifest["eos_token_id"])
                dt = [args.datatrove_python, "-c", _DATATROVE, str(tmp / "docs"), str(tmp / "dt"), spec, eos_text]
                datatrove_s, _, _ = timed([*dt, str(args.processes), str(tmp / "dt-logs")])
                shutil.rmtree(tmp / "dt", ignore_errors=True)
                shutil.rmtree(tmp / "dt-logs", ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            ours_rate = ours_tokens / ours_s / 1e6
            phase_rate = ours_tokens / max(ours_s - start_s, 1e-9) / 1e6  # the run less its start-up
            ours_per_cpu = ours_tokens / max(ours_cpu - start_cpu, 1e-9) / 1e6  # ... in CPU seconds
            raw_cells = " ".join(f"{raws[e]:>12.2f}" for e in engines)
            print(
                f"{Path(spec).name:<18} {ours_tokens:>10,} {raw_cells} {encoder_rate:>8.2f} {chosen:>8} {cold_s:>6.2f} "
                f"{ours_s:>6.2f} {ours_rate:>8.2f} {100 * ours_rate / raws.get(chosen, float('nan')):>4.0f}% "
                f"{start_s:>7.2f} {start_cpu:>9.2f} {100 * phase_rate / raws.get(chosen, float('nan')):>6.0f}% "
                f"{tiktoken_s:>8.2f} {dolma_s:>7.1f} {dolma_s / ours_s:>4.1f}x {same:>4} {datatrove_s:>8.1f} "
                f"{datatrove_s / ours_s:>4.1f}x {ours_cpu:>6.2f} {dolma_cpu:>9.1f} {dolma_cpu / ours_cpu:>5.1f}x "
                f"{per_cpu[chosen]:>7.2f} {ours_per_cpu:>8.2f} {100 * ours_per_cpu / per_cpu[chosen]:>4.0f}%",
                flush=True,
            )
        print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _auto_engine(spec: str, env: dict[str, str]) -> str:
    """The engine `--backend auto` picks for `spec` (asked in a subprocess with the run's cache)."""
    code = f"from olmo_data.tokenizer import load_tokenizer; print(load_tokenizer({spec!r}).backend)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
