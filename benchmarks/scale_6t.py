"""Benchmark: the data commands on OLMo 3's pretraining at full scale, simulated: 6e12 tokens in 4,000 remote uint32
token files at 50 ms a round trip (tests/sim_store.py, served from a process of its own).

The run is an OLMo-core config.json (its data sections as OLMo-core's classes write them) whose work_dir is the
training cluster's folder, absent here, and an OLMo-form YAML over the same files. Each command runs as a user runs
it (`olmo-data ...`, a fresh process), first with an empty cache (`OLMO_DATA_CACHE`), then again with the cache the
first call left (a repeated call). For each: wall seconds, requests the store answered (HEAD / GET / bytes), peak
RSS (the child's ru_maxrss, from wait4), and whether the answer equals the store's own computation (below).

Commands: `inspect-batch --step S --order URL --json` (the order copied to the store's orders/ folder;
`inspect-text`: the same without --json, as a user reads it, unchecked), the same with `--order` naming a folder
without it (so the order is rebuilt), `stats --no-lengths --json`, `stats --json` (document lengths: every file's
metadata), `trace --document ID --json` (a document in the middle of a late file), `build-order --destination DIR`
(its file compared with the store's order); and on an OLMo-form YAML over the same files (`sim.olmo_config`: OLMo's
save_folder/train_data is the cluster's, absent; its order copied to the store's olmo/train_data/), `yaml-inspect`
(`inspect-batch YAML --step S --order URL --json`) and `yaml-trace` (`trace YAML --document ID --order URL --json`).
Each has a time limit (`--limit`); a command past it is reported as such.

Answers checked against the store's own computation, without the toolkit's code: inspect-batch's instances are the
order file's entries (read by range from the store; OLMo's epochs count from 0, OLMo-core's from 1), each one's file
and offset from the generator, a sample's tokens; trace's targets are the document's token range in its file and its
hits (step, position, instance, the tokens of the instance and of the document) those of the instances covering that
range, found in each epoch's order by numpy over the store's order cache files (`--order-cache`; the store serves
the OLMo-core run's second epoch's order too, as its work_dir would hold it: its max_duration reaches that epoch's
first batch); stats' sequence length, instances, tokens, steps, per file
tokens, instances, dropped tokens and documents those of the generator (document lengths are not checked).

    python benchmarks/scale_6t.py [--files 4000] [--tokens 6e12] [--latency 0.05] [--step 1000000]
        [--commands inspect,inspect-rebuild,stats,stats-lengths,trace,build-order,yaml-inspect,yaml-trace]
        [--limit 900] [--order-cache /tmp/sim-order-cache] [--doc-index [--index-cache /tmp/sim-index-cache]]

With `--doc-index` the store serves a range-readable document index beside every metadata file, as `olmo-data
index-documents` leaves it (tests/sim_doc_index.py); their sorted id hashes are computed before the store answers
(at 6T: 2.4e9 ids, about 20 minutes on 2 processes, ~29 GB kept in `--index-cache` for later runs). inspect-batch's
answer then includes the documents of a sample of instances, checked against the generator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests import sim_store as sim  # noqa: E402

OLMO_DATA = str(ROOT / ".venv" / "bin" / "olmo-data")


WRAPPER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def run_command(args: list[str], env: dict[str, str], limit: float, out: Path) -> dict[str, Any]:
    """One command in a fresh process: seconds, exit status, peak RSS (GiB) and its stdout (in `out`)."""
    began = time.perf_counter()
    with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
        # through a small wrapper process: a child forked straight from this one (which maps orders gigabytes
        # large to check answers) would start with this process's RSS as its own high-water mark
        wrapped = [sys.executable, "-c", WRAPPER, f"{out}.rss", OLMO_DATA, *args]
        child = subprocess.Popen(wrapped, stdout=stdout, stderr=stderr, env=env, start_new_session=True)
        status: int | None = None
        timed_out, usage = False, None
        while status is None:
            pid, code, rusage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                status, usage = code, rusage
            elif time.perf_counter() - began > limit:
                os.killpg(child.pid, 9)
                _, status, usage = os.wait4(child.pid, 0)
                timed_out = True
            else:
                time.sleep(0.05)
    child.returncode = 0  # reaped by wait4
    rc: int | str = "timeout" if timed_out else os.waitstatus_to_exitcode(status)
    return {
        "seconds": time.perf_counter() - began,
        "rc": rc,
        "peak_gib": int(rss.read_text()) / 2**20 if (rss := Path(f"{out}.rss")).is_file() else None,
        "stderr_tail": Path(f"{out}.err").read_text(errors="replace")[-400:],
    }


def ranged(url: str, start: int, length: int) -> bytes:
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + length - 1}"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return bytes(r.read())


def expected_instances(spec: sim.SimSpec, base: str, step: int, olmo: bool = False) -> np.ndarray:
    """The step's instances from the store's order file, read straight from it: OLMo-core's rule (its epoch 1),
    or with `olmo` OLMo's (epoch 0, `sim.OLMO_ORDER_KEY`)."""
    per_batch = spec.instances_per_batch
    per_epoch = sim.dataset_size(spec) // per_batch
    epoch, batch = (step - 1) // per_epoch, (step - 1) % per_epoch
    if olmo:
        assert epoch == 0, f"step {step} is in OLMo's epoch {epoch}: the store holds epoch 0"
        url = f"{base}/{sim.OLMO_ORDER_KEY}"
    else:
        assert epoch + 1 in spec.order_epochs, f"step {step}: epoch {epoch + 1}; the store has {spec.order_epochs}"
        url = f"{base}/orders/{sim.order_name(spec, epoch + 1)}"
    raw = ranged(url, 4 * batch * per_batch, 4 * per_batch)
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)


def check_inspect(spec: sim.SimSpec, urls: list[str], out: Path, want: np.ndarray, epoch: int) -> str:
    """'equal' when the epoch, every instance, file, offset and the tokens of a sample of instances are the
    store's."""
    got = json.loads(out.read_text())
    instances = [i["instance"] for i in got["instances"]]
    if got["epoch"] != epoch:
        return f"epoch {got['epoch']}, not {epoch}"
    if instances != want.tolist():
        return "instances differ"
    for inst, k in zip(got["instances"], instances, strict=True):
        i, offset = sim.instance_location(spec, k)
        if (inst["path"], inst["token_offset"]) != (urls[i], offset):
            return f"instance {k}: location differs"
    documents = 0
    for inst in got["instances"][:: max(1, len(instances) // 16)]:
        if not np.array_equal(inst["token_ids"], sim.instance_tokens(spec, inst["instance"])):
            return f"instance {inst['instance']}: tokens differ"
        i, offset = sim.instance_location(spec, inst["instance"])
        ids = [d["id"] for d in inst["documents"] or []]
        if ids != covering(spec, i, offset, offset + spec.sequence_length):
            return f"instance {inst['instance']}: documents differ"
        documents += len(ids)
    return f"equal (a sample's {documents} documents too)" if documents else "equal"


def covering(spec: sim.SimSpec, i: int, start: int, end: int) -> list[str]:
    """The ids of file i's documents overlapping tokens [start, end) (none without metadata), from the generator:
    documents come in pairs of 2A tokens, so those near start / (2A) are all there is to look at."""
    if not sim.has_metadata(spec, i):
        return []
    a, _ = sim._pair(spec, i)
    j = np.arange(max(0, 2 * (start // (2 * a)) - 2), min(sim.document_count(spec, i), 2 * (end // (2 * a)) + 4))
    starts, ends = sim.document_bounds(spec, i, j)
    return [sim.document_id(spec, i, int(k)) for k in j[(starts < end) & (ends > start)]]


def late_document(spec: sim.SimSpec) -> tuple[int, int]:
    """(file, document) of a document in the middle of a late file that has metadata: the first from the middle on
    that two instances share (so that its hits have tokens at both ends of an instance), if one is near."""
    i = next((i for i in range(spec.files - 3, 0, -1) if sim.has_metadata(spec, i)), spec.files - 3)
    middle = sim.document_count(spec, i) // 2
    near = np.arange(middle, min(middle + 256, sim.document_count(spec, i)))
    starts, ends = sim.document_bounds(spec, i, near)
    crossing = np.flatnonzero(starts // spec.sequence_length != (ends - 1) // spec.sequence_length)
    return i, int(near[crossing[0]]) if len(crossing) else middle


SEARCH_ENTRIES = 1 << 26  # order entries searched at a time (256 MB of uint32)


def positions_of(order: np.ndarray, wanted: np.ndarray, stop: int) -> np.ndarray:
    """The positions below `stop` of `order` (a memory map of the store's order cache) holding one of `wanted`,
    a block at a time: numpy compares, never a Python loop over the entries, and never the whole order in memory."""
    found = []
    for lo in range(0, stop, SEARCH_ENTRIES):
        block = np.asarray(order[lo : min(stop, lo + SEARCH_ENTRIES)])
        found.append(np.flatnonzero(np.isin(block, wanted)) + lo)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def run_steps(spec: sim.SimSpec, olmo: bool) -> int:
    """The steps each run trains: the YAML's one epoch of whole batches; the OLMo-core config's max_duration, one
    epoch's instance tokens, in steps of a batch's tokens (rounded up: into epoch 2 when a tail is dropped)."""
    n, per_batch = sim.dataset_size(spec), spec.instances_per_batch
    return n // per_batch if olmo else -(-n * spec.sequence_length // (per_batch * spec.sequence_length))


def check_trace(spec: sim.SimSpec, out: Path, doc: tuple[int, int], orders: sim.Orders, olmo: bool) -> str:
    """'equal (H hits)' when the trace's target is the document's token range and its hits are, step for step,
    those of the instances covering that range: their positions in each epoch's order the run reaches."""
    got = json.loads(out.read_text())
    i, j = doc
    L, per_batch = spec.sequence_length, spec.instances_per_batch
    start, end = (int(x[0]) for x in sim.document_bounds(spec, i, np.array([j])))
    targets = [(t["name"], t["file_index"], t["start"], t["end"]) for t in got["targets"]]
    if targets != [(sim.document_id(spec, i, j), i, start, end)]:
        return f"targets differ: {targets[:2]}"
    last = run_steps(spec, olmo)
    if (got["first_step"], got["last_step"]) != (1, last):
        return f"steps {got['first_step']}..{got['last_step']}, not 1..{last}"
    counts = sim.instance_counts(spec)
    first = int(counts[:i].sum())
    local = np.arange(start // L, min((end - 1) // L, int(counts[i]) - 1) + 1)  # a file's tail is no instance
    per_epoch = sim.dataset_size(spec) // per_batch
    want = []
    for e in range(-(-last // per_epoch)):  # 0-based epochs the run reaches
        order = orders.permutation(spec.olmo_seed + e) if olmo else orders.get(e + 1)
        steps = min(per_epoch, last - e * per_epoch)
        for p in positions_of(order, first + local, steps * per_batch).tolist():
            k = int(order[p]) - first
            lo, hi = max(start, k * L), min(end, (k + 1) * L)
            want.append(
                (e * per_epoch + p // per_batch + 1, p % per_batch, first + k)
                + (lo - k * L, hi - k * L, lo - start, hi - start)
            )
    keys = ("step", "position", "instance", "instance_start", "instance_end", "target_start", "target_end")
    hits = sorted(tuple(h[k] for k in keys) for h in got["hits"])
    if hits != sorted(want):
        return f"hits differ: {len(hits)} found, {len(want)} computed"
    return f"equal ({len(hits)} hits)"


def check_build_order(spec: sim.SimSpec, folder: Path, orders: sim.Orders) -> str:
    """'equal' when the order build-order wrote (OLMo-core's name, epoch 1) holds the store's bytes, compared a
    block at a time."""
    path = folder / sim.order_name(spec, 1)
    if not path.is_file():
        return f"no {path.name} in {folder}: {sorted(p.name for p in folder.iterdir())[:3]}"
    written, want = np.memmap(path, dtype="<u4", mode="r"), orders.get(1)
    if len(written) != len(want):
        return f"{len(written):,} entries, not {len(want):,}"
    for lo in range(0, len(want), SEARCH_ENTRIES):
        if not np.array_equal(written[lo : lo + SEARCH_ENTRIES], want[lo : lo + SEARCH_ENTRIES]):
            return f"entries from {lo:,} differ"
    return "equal"


def check_stats(spec: sim.SimSpec, urls: list[str], out: Path) -> str:
    """'equal' when the totals, steps and every file's tokens, instances, dropped tokens and documents (a count
    where the file has metadata, none where it has not) are the generator's."""
    got = json.loads(out.read_text())
    n, L, per_batch = sim.dataset_size(spec), spec.sequence_length, spec.instances_per_batch
    totals = (got["sequence_length"], got["num_instances"], got["instance_tokens"], got["file_tokens"])
    if totals != (L, n, n * L, spec.total_tokens):
        return f"totals differ: {totals}"
    run = (got["global_batch_size"], got["batches_per_epoch"], got["dropped_per_epoch"], got["steps"])
    if run != (per_batch, n // per_batch, n % per_batch, run_steps(spec, olmo=False)):
        return f"batches differ: {run}"
    tokens, instances = sim.token_counts(spec).tolist(), sim.instance_counts(spec).tolist()
    want = [
        (
            urls[i],
            tokens[i],
            instances[i],
            tokens[i] % L,
            sim.document_count(spec, i) if sim.has_metadata(spec, i) else None,
        )
        for i in range(spec.files)
    ]
    files = [(f["path"], f["tokens"], f["instances"], f["dropped_tokens"], f["documents"]) for f in got["files"]]
    if files != want:
        bad = next(k for k, (a, b) in enumerate(zip(files, want, strict=False)) if a != b) if files else 0
        return f"files differ ({len(files)} listed; first at {bad})"
    return "equal" if not got.get("document_lengths") else "equal (document lengths not checked)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--tokens", type=float, default=6e12)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--step", type=int, default=1_000_000)
    parser.add_argument(
        "--commands", default="inspect,inspect-rebuild,stats,stats-lengths,trace,build-order,yaml-inspect,yaml-trace"
    )
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a command may take")
    parser.add_argument("--order-cache", default=str(Path(tempfile.gettempdir()) / "sim-order-cache"))
    parser.add_argument("--no-repeat", action="store_true", help="first calls only")
    parser.add_argument("--no-metadata", action="store_true", help="no file has .csv.gz metadata (no documents)")
    parser.add_argument("--doc-index", action="store_true", help="a .docs.idx beside every metadata file")
    parser.add_argument(
        "--index-cache", default=str(Path(tempfile.gettempdir()) / "sim-index-cache"), help="their id hashes, kept"
    )
    args = parser.parse_args()
    spec = sim.SimSpec.olmo3(
        files=args.files, total_tokens=int(args.tokens), metadata=not args.no_metadata, doc_index=args.doc_index
    )
    per_epoch = sim.dataset_size(spec) // spec.instances_per_batch
    step = min(args.step, per_epoch)
    print(
        f"# {spec.files} files, {spec.total_tokens:.3g} tokens, {sim.dataset_size(spec):,} instances of "
        f"{spec.sequence_length}, {per_epoch:,} steps an epoch; step {step:,}; {args.latency * 1000:g} ms a request; "
        f"{'no' if args.no_metadata else 'with'} metadata{', document indexes' if args.doc_index else ''}; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    server_cmd = [sys.executable, "-m", "tests.sim_store", "--scale", "olmo3", "--files", str(spec.files)]
    server_cmd += ["--tokens", str(spec.total_tokens), "--latency", str(args.latency)]
    server_cmd += ["--order-cache", args.order_cache, *(["--no-metadata"] if args.no_metadata else [])]
    if args.doc_index:  # (their sorted id hashes computed first, on 2 processes, unless kept from an earlier run)
        server_cmd += ["--doc-index", "--index-cache", args.index_cache, "--prepare-indexes", "2"]
    began = time.perf_counter()
    server = subprocess.Popen(server_cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        print(f"# store at {url}, its order ready in {time.perf_counter() - began:.0f} s", flush=True)
        base = f"{url}/{spec.bucket}"
        urls = [f"{base}/tokens/part-{i:05d}.npy" for i in range(spec.files)]
        with tempfile.TemporaryDirectory() as work:
            config = Path(work) / "config.json"
            config.write_text(json.dumps(sim.olmo_core_config(spec, urls)))
            olmo_yaml = str(sim.write_olmo_yaml(spec, urls, Path(work) / "OLMo-7B-sim.yaml"))
            doc = late_document(spec)
            doc_id = sim.document_id(spec, *doc)
            commands = {
                "inspect": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/orders", "--json"],
                "inspect-text": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/orders"],
                "inspect-rebuild": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/none"]
                + ["--json"],
                "stats": ["stats", str(config), "--no-lengths", "--json"],
                "stats-lengths": ["stats", str(config), "--json"],
                "trace": ["trace", str(config), "--document", doc_id, "--order", f"{base}/orders", "--json"],
                "build-order": ["build-order", str(config), "--destination", str(Path(work) / "orders")],
                "yaml-inspect": ["inspect-batch", olmo_yaml, "--step", str(step), "--order", f"{base}/olmo/train_data"]
                + ["--json"],
                "yaml-trace": ["trace", olmo_yaml, "--document", doc_id, "--order", f"{base}/olmo/train_data"]
                + ["--json"],
            }
            want = expected_instances(spec, base, step)
            want_olmo = expected_instances(spec, base, step, olmo=True)
            orders = sim.Orders(spec, args.order_cache)  # the store's cache files, mapped (built by the store)
            epoch = (step - 1) // per_epoch

            def check(name: str, out: Path) -> str:
                if name in ("inspect", "inspect-rebuild"):
                    return check_inspect(spec, urls, out, want, epoch + 1)
                if name == "yaml-inspect":
                    return check_inspect(spec, urls, out, want_olmo, epoch)
                if name in ("trace", "yaml-trace"):
                    return check_trace(spec, out, doc, orders, olmo=name == "yaml-trace")
                if name.startswith("stats"):
                    return check_stats(spec, urls, out)
                if name == "build-order":
                    return check_build_order(spec, Path(work) / "orders", orders)
                return "ok"  # inspect-text: read by people

            print("| command | call | seconds | HEAD | GET | MB read | peak RSS GiB | answer |")
            print("|---|---|---|---|---|---|---|---|")
            for name in args.commands.split(","):
                cache = Path(work) / f"cache-{name}"
                env = {**os.environ, "OLMO_DATA_CACHE": str(cache)}
                for call in ("first", "repeated")[: 1 if args.no_repeat else 2]:
                    before = sim.fetch_stats(url)
                    out = Path(work) / f"{name}-{call}.out"
                    result = run_command(commands[name], env, args.limit, out)
                    after = sim.fetch_stats(url)
                    answer = "timed out" if result["rc"] == "timeout" else f"exit {result['rc']}"
                    if result["rc"] == 0:
                        answer = check(name, out)
                    heads = after["heads"] - before["heads"]
                    gets = after["gets"] - before["gets"]
                    mb = (after["bytes_sent"] - before["bytes_sent"]) / 1e6
                    whole = {k: v for k, v in after["whole_gets"].items() if before["whole_gets"].get(k) != v}
                    if whole:
                        answer += f"; whole GETs: {sorted(whole)[:3]}"
                    print(
                        f"| {name} | {call} | {result['seconds']:.1f} | {heads} | {gets} | {mb:.1f} | "
                        f"{'-' if result['peak_gib'] is None else format(result['peak_gib'], '.2f')} | {answer} |",
                        flush=True,
                    )
                    if result["rc"] not in (0, "timeout"):
                        print(f"#   {name}: {result['stderr_tail'].strip()}", flush=True)
                    if result["rc"] == "timeout":
                        break
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
