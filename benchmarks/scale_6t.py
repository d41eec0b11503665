"""Benchmark: the data commands on OLMo 3's pretraining at full scale, simulated: 6e12 tokens in 4,000 remote uint32
token files at 50 ms a round trip (tests/sim_store.py, served from a process of its own).

The run is an OLMo-core config.json (its data sections as OLMo-core's classes write them) whose work_dir is the
training cluster's folder, absent here. Each command runs as a user runs it (`olmo-data ...`, a fresh process),
first with an empty cache (`OLMO_DATA_CACHE`), then again with the cache the first call left (a repeated call).
For each: wall seconds, requests the store answered (HEAD / GET / bytes), peak RSS (the child's ru_maxrss, from
wait4), and, for inspect-batch, whether the answer equals the store's own computation (OLMo-core's order entries
read straight from the store's order file, or built by numpy for the rebuilt case; each instance's file, offset
and tokens from the generator).

Commands: `inspect-batch --step S --order URL --json` (the order copied to the store's orders/ folder; `inspect-text`:
the same without --json, as a user reads it, unchecked),
the same with `--order` naming a folder without it (so the order is rebuilt), `stats --no-lengths --json`, `stats
--json` (document lengths: every file's metadata), `trace --document ID --json` (a document in the middle of a late
file), `build-order --destination DIR`. Each has a time limit (`--limit`); a command past it is reported as such.

    python benchmarks/scale_6t.py [--files 4000] [--tokens 6e12] [--latency 0.05] [--step 1000000]
        [--commands inspect,inspect-rebuild,stats,stats-lengths,trace,build-order] [--limit 900]
        [--order-cache /tmp/sim-order-cache]
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


def run_command(args: list[str], env: dict[str, str], limit: float, out: Path) -> dict[str, Any]:
    """One command in a fresh process: seconds, exit status, peak RSS (GiB) and its stdout (in `out`)."""
    began = time.perf_counter()
    with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
        child = subprocess.Popen([OLMO_DATA, *args], stdout=stdout, stderr=stderr, env=env)
        status: int | None = None
        timed_out, usage = False, None
        while status is None:
            pid, code, rusage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                status, usage = code, rusage
            elif time.perf_counter() - began > limit:
                child.kill()
                _, status, usage = os.wait4(child.pid, 0)
                timed_out = True
            else:
                time.sleep(0.05)
    child.returncode = 0  # reaped by wait4
    rc: int | str = "timeout" if timed_out else os.waitstatus_to_exitcode(status)
    return {
        "seconds": time.perf_counter() - began,
        "rc": rc,
        "peak_gib": usage.ru_maxrss / 2**20 if usage else None,
        "stderr_tail": Path(f"{out}.err").read_text(errors="replace")[-400:],
    }


def ranged(url: str, start: int, length: int) -> bytes:
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + length - 1}"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return bytes(r.read())


def expected_instances(spec: sim.SimSpec, base: str, step: int) -> np.ndarray:
    """The step's instances from the store's order file (epoch 1), read straight from it: OLMo-core's rule."""
    per_batch = spec.instances_per_batch
    per_epoch = sim.dataset_size(spec) // per_batch
    epoch, batch = 1 + (step - 1) // per_epoch, (step - 1) % per_epoch
    assert epoch in spec.order_epochs, f"step {step} is in epoch {epoch}: the store holds epochs {spec.order_epochs}"
    raw = ranged(f"{base}/orders/{sim.order_name(spec, epoch)}", 4 * batch * per_batch, 4 * per_batch)
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)


def check_inspect(spec: sim.SimSpec, urls: list[str], out: Path, want: np.ndarray) -> str:
    """'equal' when every instance, file, offset and the tokens of a sample of instances are the store's."""
    got = json.loads(out.read_text())
    instances = [i["instance"] for i in got["instances"]]
    if instances != want.tolist():
        return "instances differ"
    for inst, k in zip(got["instances"], instances, strict=True):
        i, offset = sim.instance_location(spec, k)
        if (inst["path"], inst["token_offset"]) != (urls[i], offset):
            return f"instance {k}: location differs"
    for inst in got["instances"][:: max(1, len(instances) // 16)]:
        if not np.array_equal(inst["token_ids"], sim.instance_tokens(spec, inst["instance"])):
            return f"instance {inst['instance']}: tokens differ"
    return "equal"


def late_document(spec: sim.SimSpec) -> str:
    """A document in the middle of a late file that has metadata."""
    i = next((i for i in range(spec.files - 3, 0, -1) if sim.has_metadata(spec, i)), spec.files - 3)
    return sim.document_id(spec, i, sim.document_count(spec, i) // 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--tokens", type=float, default=6e12)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--step", type=int, default=1_000_000)
    parser.add_argument("--commands", default="inspect,inspect-rebuild,stats,stats-lengths,trace,build-order")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a command may take")
    parser.add_argument("--order-cache", default=str(Path(tempfile.gettempdir()) / "sim-order-cache"))
    parser.add_argument("--no-repeat", action="store_true", help="first calls only")
    parser.add_argument("--no-metadata", action="store_true", help="no file has .csv.gz metadata (no documents)")
    args = parser.parse_args()
    spec = sim.SimSpec.olmo3(files=args.files, total_tokens=int(args.tokens), metadata=not args.no_metadata)
    per_epoch = sim.dataset_size(spec) // spec.instances_per_batch
    step = min(args.step, per_epoch)
    print(
        f"# {spec.files} files, {spec.total_tokens:.3g} tokens, {sim.dataset_size(spec):,} instances of "
        f"{spec.sequence_length}, {per_epoch:,} steps an epoch; step {step:,}; {args.latency * 1000:g} ms a request; "
        f"{'no' if args.no_metadata else 'with'} metadata; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    server_cmd = [sys.executable, "-m", "tests.sim_store", "--scale", "olmo3", "--files", str(spec.files)]
    server_cmd += ["--tokens", str(spec.total_tokens), "--latency", str(args.latency)]
    server_cmd += ["--order-cache", args.order_cache, *(["--no-metadata"] if args.no_metadata else [])]
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
            commands = {
                "inspect": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/orders", "--json"],
                "inspect-text": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/orders"],
                "inspect-rebuild": ["inspect-batch", str(config), "--step", str(step), "--order", f"{base}/none"]
                + ["--json"],
                "stats": ["stats", str(config), "--no-lengths", "--json"],
                "stats-lengths": ["stats", str(config), "--json"],
                "trace": ["trace", str(config), "--document", late_document(spec), "--order", f"{base}/orders"]
                + ["--json"],
                "build-order": ["build-order", str(config), "--destination", str(Path(work) / "orders")],
            }
            want = expected_instances(spec, base, step)
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
                    if result["rc"] == 0 and "--json" in commands[name] and name.startswith("inspect"):
                        answer = check_inspect(spec, urls, out, want)
                    elif result["rc"] == 0:
                        answer = "ok"
                    heads = after["heads"] - before["heads"]
                    gets = after["gets"] - before["gets"]
                    mb = (after["bytes_sent"] - before["bytes_sent"]) / 1e6
                    whole = {k: v for k, v in after["whole_gets"].items() if before["whole_gets"].get(k) != v}
                    if whole:
                        answer += f"; whole GETs: {sorted(whole)[:3]}"
                    print(
                        f"| {name} | {call} | {result['seconds']:.1f} | {heads} | {gets} | {mb:.1f} | "
                        f"{result['peak_gib']:.2f} | {answer} |",
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
