"""Time and peak memory of `olmo-train unshard`, `export-hf` and `import-hf` for the OLMo-2-1B shape, on CPU.

The model of configs/olmo2-1b.yaml (about 1.48B parameters, 5.9 GB in fp32) is built with random weights and
given AdamW state (step, exp_avg and exp_avg_sq for every parameter, random moments: 11.8 GB), and the trainer's
own `save_sharded` writes the sharded checkpoint of step 1000 from `--world-size` processes (FSDP2 over gloo, as
the config's `distributed_strategy: fsdp` trains; `--world-size 1` is one plain process in a world of one). The
optimizer state is filled directly rather than by a training step, whose gradients would be one more copy of the
model (weights + gradients + two moments of 1.48B fp32 parameters do not fit in 24 GiB); that it has the
structure a real AdamW step leaves (`get_state_dict(model, optim)`: keys, dtypes, shapes, placements) is checked
first on a small model of the same kind.

Then each conversion runs as a user runs it, the `olmo-train` command in a fresh process under `/usr/bin/time -v`
(without it, a wrapper's `getrusage(RUSAGE_CHILDREN)`), so the peak RSS is that command's alone:

  unshard                  the sharded checkpoint -> model.pt + optim.pt
  unshard --model-only     the sharded checkpoint -> model.pt
  export-hf float32        the sharded checkpoint -> safetensors (its reload by transformers included)
  export-hf bfloat16       the same, weights written in bf16
  export-hf float32 (pt)   the model-only unsharded checkpoint -> safetensors
  import-hf                the float32 export -> model.pt

Each command's log lines are stamped as they arrive and its RSS (anonymous and file-backed) is sampled every
0.1 s, so the phase breakdown (a phase = from one log line to the next) shows where the time and the memory go.
`sync` runs between commands, outside the timings, so one's writes are not flushed during the next; reads come
from the page cache where the files fit in it (a cold disk adds its read time).

Disk: about 2x the checkpoint (model + optimizer state) free, ~38 GB for the 1B shape; everything is written in a
temporary directory under --tmp (default /tmp) that is removed at the end, also on failure or Ctrl-C.

    python benchmarks/conversions.py                               # OLMo-2-1B, saved by 2 FSDP ranks
    python benchmarks/conversions.py --world-size 1                # saved by one process
    python benchmarks/conversions.py --config configs/tiny.yaml    # the whole script in seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
STEP = 1000
GiB = 2**30

# used when /usr/bin/time is missing: the peak RSS of the one child this fresh wrapper waits for
_WRAPPER = """import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
wall = time.perf_counter() - t
u = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    f.write(f"Elapsed (wall clock) time (h:mm:ss or m:ss): 0:{wall:.2f}\\n")
    f.write(f"Maximum resident set size (kbytes): {u.ru_maxrss}\\n")
    f.write(f"User time (seconds): {u.ru_utime:.2f}\\nSystem time (seconds): {u.ru_stime:.2f}\\nExit status: {rc}\\n")
"""


# ---- the checkpoint ----------------------------------------------------------------------------------------


def state_structure(obj: Any, prefix: str = "") -> dict[str, str]:
    """Every leaf of a nested state dict: its type, and for tensors their dtype, shape and placements."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(state_structure(value, f"{prefix}/{key}"))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            out.update(state_structure(value, f"{prefix}/{i}"))
    elif isinstance(obj, torch.Tensor):
        out[prefix] = f"{type(obj).__name__} {obj.dtype} {tuple(obj.shape)} {getattr(obj, 'placements', '')}"
    else:
        out[prefix] = type(obj).__name__
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or a DTensor's local shard (a view: filling it fills the DTensor)."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[no-any-return]


def make_model(model_cfg: Any, world_size: int) -> torch.nn.Module:
    """The model with random weights: plain, or FSDP2-sharded over the process group (built on the meta device and
    materialised shard by shard, so no rank ever holds the whole model)."""
    from olmo_train.nn import Transformer

    if world_size == 1:
        return Transformer(model_cfg)
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = Transformer(model_cfg)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            _local(p).normal_(0.0, model_cfg.init_std)
    return model


def fill_adamw_state(optim: torch.optim.Optimizer, step: int) -> None:
    """The state AdamW keeps after `step` steps, with random moments: what `_init_group` creates, in its order."""
    with torch.no_grad():
        for group in optim.param_groups:
            for p in group["params"]:
                exp_avg, exp_avg_sq = torch.empty_like(p), torch.empty_like(p)
                _local(exp_avg).normal_(0.0, 1e-3)
                _local(exp_avg_sq).uniform_(0.0, 1e-6)
                optim.state[p] = {"step": torch.tensor(float(step)), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def check_structure(model_cfg: Any, optim_cfg: Any, world_size: int) -> None:
    """On a small model of the same kind, the directly filled state has exactly the structure that a real AdamW
    step gives `get_state_dict(model, optim)`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from olmo_train.train import build_optimizer

    small = dataclasses.replace(
        model_cfg, d_model=64, n_heads=4, n_layers=2, mlp_hidden_size=128, vocab_size=250, embedding_size=256
    )
    structures = []
    for real_step in (True, False):
        torch.manual_seed(0)
        model = make_model(small, world_size)
        optim = build_optimizer(model, optim_cfg)
        if real_step:
            model(torch.randint(0, small.vocab_size, (2, 16))).float().mean().backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        else:
            fill_adamw_state(optim, STEP)
        structures.append(state_structure(get_state_dict(model, optim)))
    if structures[0] != structures[1]:
        diff = sorted(set(structures[0].items()) ^ set(structures[1].items()))
        raise SystemExit(f"the filled optimizer state differs from a real step's: {diff[:6]}")


def build_worker(rank: int, world_size: int, config: str, overrides: list[str], workdir: str, port: int) -> None:
    """One rank of the run that writes the checkpoint (torch.multiprocessing entry point)."""
    from olmo_data.config import load_config
    from olmo_train.checkpoint import TrainerState, save_sharded
    from olmo_train.distributed import init_distributed, shutdown
    from olmo_train.train import build_optimizer

    if world_size > 1:  # as torchrun sets them; without RANK init_distributed makes a world of one
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    d = init_distributed()
    try:
        cfg = load_config(config, overrides, require_data=False)
        check_structure(cfg.model, cfg.optimizer, world_size)
        t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)
        model = make_model(cfg.model, world_size)
        optim = build_optimizer(model, cfg.optimizer)
        fill_adamw_state(optim, STEP)
        t1 = time.perf_counter()
        batch, length = cfg.global_train_batch_size, cfg.model.max_sequence_length
        state = TrainerState(
            step=STEP,
            tokens_seen=STEP * batch * length,
            instances_seen=STEP * batch,
            world_size=world_size,
            global_train_batch_size=batch,
            sequence_length=length,
            seed=cfg.seed,
            run_name=cfg.run_name,
        )
        path = save_sharded(Path(cfg.save_folder), model, optim, state, keep=-1, d=d, cfg=cfg)
        t2 = time.perf_counter()
        report = {
            "rank": rank,
            "path": str(path),
            "build_s": t1 - t0,
            "save_s": t2 - t1,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB,
        }
        Path(workdir, f"build-rank{rank}.json").write_text(json.dumps(report))
    finally:
        shutdown()


def write_checkpoint(config: str, overrides: list[str], workdir: Path, world_size: int) -> list[dict[str, Any]]:
    """The sharded checkpoint, written by `world_size` fresh processes (the parent never holds the model)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for the gloo rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        build_worker,
        args=(world_size, config, overrides, str(workdir), port),
        nprocs=world_size,
        start_method="spawn",
    )
    return [json.loads((workdir / f"build-rank{r}.json").read_text()) for r in range(world_size)]


# ---- measuring a command -----------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    """Samples the RSS of the measured command (the child of `/usr/bin/time` or of the wrapper) every `interval`
    seconds and keeps the largest per phase (the phase is set from outside: the last log line)."""

    def __init__(self, parent_pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.parent_pid, self.interval = parent_pid, interval
        self.phase = "(start-up and imports)"
        self.peaks: dict[str, dict[str, float]] = {}
        self.done = threading.Event()

    def _measured_pid(self) -> int | None:
        try:
            children = Path(f"/proc/{self.parent_pid}/task/{self.parent_pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def run(self) -> None:
        pid = None
        while not self.done.is_set():
            pid = pid or self._measured_pid()
            if pid is not None:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    status = ""
                values = {
                    k: int(v) * 1024 / GiB for k, v in re.findall(r"^(VmRSS|RssAnon|RssFile):\s+(\d+)", status, re.M)
                }
                if values:
                    peak = self.peaks.setdefault(self.phase, {})
                    for key, value in values.items():
                        peak[key] = max(peak.get(key, 0.0), value)
            self.done.wait(self.interval)


def _seconds(clock: str) -> float:
    return sum(float(x) * 60**i for i, x in enumerate(reversed(clock.strip().split(":"))))


def _meminfo_available_gib() -> float:
    m = re.search(r"^MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) * 1024 / GiB if m else float("nan")


def measure(name: str, argv: list[str], workdir: Path) -> dict[str, Any]:
    """Run one command in a fresh process; its wall time, CPU time, peak RSS, and the phases of its log."""
    os.sync()  # the previous command's writes are flushed now, not during this one
    timing = workdir / f"time-{re.sub(r'[^a-z0-9]+', '-', name.lower())}.txt"
    gnu_time = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if gnu_time:
        cmd = [gnu_time, "-v", "-o", str(timing), *argv]
    else:
        cmd = [sys.executable, "-c", _WRAPPER, str(timing), *argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    print(f"\n== {name}: {' '.join(argv)}", flush=True)
    before = {"mem_available_gib": _meminfo_available_gib(), "loadavg": os.getloadavg()[0]}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sampler = RssSampler(proc.pid)
    sampler.start()
    marks: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        t, line = time.perf_counter() - start, raw.rstrip()
        print(f"  [{t:7.1f} s] {line}", flush=True)
        if re.match(r"(INFO|WARNING|ERROR) ", line):  # a log line starts a phase (progress bars do not)
            marks.append((t, line))
            sampler.phase = line
    rc = proc.wait()
    end = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    text = timing.read_text()
    field = dict(line.strip().rpartition(": ")[::2] for line in text.splitlines() if ": " in line)
    if rc != 0:
        raise SystemExit(f"{name} failed with exit status {rc}")
    phases = []
    starts = [(0.0, "(start-up and imports)"), *marks]
    for i, (t, line) in enumerate(starts):
        t_next = starts[i + 1][0] if i + 1 < len(starts) else end
        peak = sampler.peaks.get(line, {})
        phases.append({"phase": line, "start_s": t, "seconds": t_next - t, **peak})
    return {
        "name": name,
        "argv": argv,
        "wall_s": _seconds(field["Elapsed (wall clock) time (h:mm:ss or m:ss)"]),
        "cpu_s": float(field["User time (seconds)"]) + float(field["System time (seconds)"]),
        "peak_rss_gib": int(field["Maximum resident set size (kbytes)"]) * 1024 / GiB,
        "phases": phases,
        **before,
    }


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# ---- the run -----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "olmo2-1b.yaml"))
    parser.add_argument("--world-size", type=int, default=2, help="processes that save the sharded checkpoint")
    parser.add_argument("--tmp", default="/tmp", help="where the temporary directory is made")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    from olmo_data.config import load_config
    from olmo_train.nn import Transformer

    cfg = load_config(args.config, ["--data.paths=[]"], require_data=False)
    with torch.device("meta"):
        n_params = Transformer(cfg.model).num_params()
    model_bytes, optim_bytes = 4 * n_params, 8 * n_params
    need = int(2.1 * (model_bytes + optim_bytes)) + 2 * 10**9
    free = shutil.disk_usage(args.tmp).free
    print(
        f"{args.config}: {n_params / 1e9:.3f}B parameters; model {model_bytes / 1e9:.2f} GB, AdamW state "
        f"{optim_bytes / 1e9:.2f} GB (fp32); {free / 1e9:.0f} GB free in {args.tmp}, ~{need / 1e9:.0f} GB needed"
    )
    if free < need:
        raise SystemExit(f"not enough disk space in {args.tmp}: {free / 1e9:.1f} GB free, ~{need / 1e9:.1f} GB needed")
    cli = Path(sys.executable).parent / "olmo-train"
    olmo_train = [str(cli)] if cli.exists() else [sys.executable, "-c", "from olmo_cli.train_main import main; main()"]

    workdir = Path(tempfile.mkdtemp(prefix="olmo-conversions-", dir=args.tmp))
    try:
        strategy = "fsdp" if args.world_size > 1 else "single"
        overrides = [
            "--data.paths=[]",  # no data, so no tokenizer: export-hf warns and writes none
            f"--save_folder={workdir / 'run'}",
            f"--distributed_strategy={strategy}",
        ]
        print(f"writing the sharded checkpoint of step {STEP} from {args.world_size} process(es) ...", flush=True)
        t0 = time.perf_counter()
        build = write_checkpoint(args.config, overrides, workdir, args.world_size)
        print(f"  done in {time.perf_counter() - t0:.1f} s: {json.dumps(build)}", flush=True)
        sharded = Path(build[0]["path"])
        sizes: dict[str, int] = {"sharded": dir_size(sharded)}
        out = workdir / "out"
        results: list[dict[str, Any]] = []

        def run(name: str, args_: list[str], source: str, dest: Path, *, keep: bool = False) -> None:
            r = measure(name, [*olmo_train, *args_], workdir)
            sizes[name] = dir_size(dest)
            r.update(input=source, input_bytes=sizes[source], output_bytes=sizes[name])
            results.append(r)
            if not keep:
                shutil.rmtree(dest)

        unsharded, model_pt = out / f"step{STEP}-unsharded", out / f"step{STEP}-model"
        hf32, hf16, hf32pt, imported = out / "hf-fp32", out / "hf-bf16", out / "hf-fp32-from-pt", out / "imported"
        run("unshard", ["unshard", str(sharded), "--destination", str(unsharded)], "sharded", unsharded)
        run(
            "unshard --model-only",
            ["unshard", str(sharded), "--destination", str(model_pt), "--model-only"],
            "sharded",
            model_pt,
            keep=True,
        )
        run("export-hf float32", ["export-hf", str(sharded), "--destination", str(hf32)], "sharded", hf32, keep=True)
        run(
            "export-hf bfloat16",
            ["export-hf", str(sharded), "--destination", str(hf16), "--dtype", "bfloat16"],
            "sharded",
            hf16,
        )
        run(
            "export-hf float32 (from model.pt)",
            ["export-hf", str(model_pt), "--destination", str(hf32pt)],
            "unshard --model-only",
            hf32pt,
        )
        run("import-hf", ["import-hf", str(hf32), "--destination", str(imported)], "export-hf float32", imported)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    peaks = ", ".join(f"{b['peak_rss_gib']:.1f}" for b in build)
    print(
        f"\n{args.config}: {n_params:,} parameters (model {model_bytes / 1e9:.2f} GB, AdamW moments "
        f"{optim_bytes / 1e9:.2f} GB); checkpoint saved by {args.world_size} process(es) in "
        f"{max(b['save_s'] for b in build):.1f} s (peak RSS per rank "
        f"{peaks} GiB); torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| command | input | input GB | output GB | wall s | CPU s | peak RSS GiB | peak / model (fp32) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| `{r['name']}` | {r['input']} | {r['input_bytes'] / 1e9:.2f} | {r['output_bytes'] / 1e9:.2f} | "
            f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_gib']:.2f} | "
            f"{r['peak_rss_gib'] * GiB / model_bytes:.2f}x |"
        )
    print("\nphases (from one log line to the next): seconds, peak RSS GiB (anonymous + file-backed)")
    for r in results:
        print(f"{r['name']} (before: {r['mem_available_gib']:.1f} GiB available, load {r['loadavg']:.1f}):")
        for p in r["phases"]:
            rss = (
                f"{p['VmRSS']:5.2f} ({p['RssAnon']:.2f} + {p['RssFile']:.2f})"
                if "VmRSS" in p
                else "    - (not sampled)"
            )
            print(f"  {p['seconds']:7.1f} s  {rss}  {p['phase'][:110]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"n_params": n_params, "build": build, "results": results}, indent=1))


if __name__ == "__main__":
    main()
