"""Peak memory and time of `olmo-train soup` for the OLMo-2-1B shape: is it about two tensors, not N models?

Two parent checkpoints of configs/olmo2-1b.yaml's model (about 1.48B parameters, 5.9 GB in fp32 each) with random
weights: A unsharded (model.pt), B sharded (torch.distributed.checkpoint, one shard file), each with config.yaml,
checksums.json and trainer_state.json, written tensor by tensor (`stream_model_file`), so building them needs
little memory either. Then `olmo-train soup A B` runs as a user runs it, in a fresh process, and its memory is
sampled every 0.05 s from /proc (VmRSS, and RssAnon: the process's own memory, not the file pages it maps), with
the kernel's peak RSS for it (getrusage of the child) at the end. Three tensors of the soup are checked against
the mean of the parents'. Everything is written in a temporary directory under --tmp, removed at the end.

Disk: about 3x the model (~18 GB for the 1B shape).

    python benchmarks/soup_memory.py                               # OLMo-2-1B
    python benchmarks/soup_memory.py --config configs/tiny.yaml    # the whole script in seconds
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
# a fresh, small process that runs the command and reports its peak RSS: a child forked from this (large) process
# would start its ru_maxrss at this process's RSS
_WRAPPER = """import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {rc}")
"""


def shapes_of(config: Path) -> tuple[object, dict[str, torch.Size]]:
    from olmo_data.config import load_config
    from olmo_train.nn import Transformer

    cfg = load_config(config, require_data=False)
    with torch.device("meta"):
        model = Transformer(cfg.model)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.model.weight_tying:
        shapes.pop("lm_head.weight", None)
    return cfg, shapes


def random_tensor(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + sum(map(ord, name)))
    return torch.randn(shape, generator=g) * 0.02


def finish(directory: Path, cfg: object, name: str, files: list[str]) -> None:
    """config.yaml, checksums.json of every file, then trainer_state.json: a complete checkpoint of ours."""
    import dataclasses

    from olmo_data.config import save_config
    from olmo_train import checkpoint as ckpt
    from olmo_train.checkpoint.integrity import Recorder

    save_config(dataclasses.replace(cfg, run_name=name), directory / ckpt.CONFIG)  # type: ignore[type-var]
    written = Recorder(directory)
    for f in [*files, ckpt.CONFIG]:
        written.add_file(f)
    state = ckpt.TrainerState(step=1000, run_name=name, tokens_seen=1000 * 2**21)
    written.finish(ckpt.TRAINER_STATE, state.to_bytes())


def build_parents(tmp: Path, cfg: object, shapes: dict[str, torch.Size]) -> tuple[Path, Path]:
    import torch.distributed.checkpoint as dcp

    from olmo_train.checkpoint.soup import stream_model_file

    a, b, scratch = tmp / "anneal-a", tmp / "anneal-b", tmp / "scratch"
    for d in (a, b, scratch):
        d.mkdir()
    t0 = time.perf_counter()
    stream_model_file(a / "model.pt", shapes, lambda n: random_tensor(n, shapes[n], 1))
    finish(a, cfg, "anneal-a", ["model.pt"])
    stream_model_file(scratch / "model.pt", shapes, lambda n: random_tensor(n, shapes[n], 2))
    mapped = torch.load(scratch / "model.pt", mmap=True, weights_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": mapped}, storage_writer=dcp.FileSystemWriter(str(b)))
    del mapped
    shutil.rmtree(scratch)
    finish(b, cfg, "anneal-b", sorted(p.name for p in b.iterdir()))
    print(f"parents written in {time.perf_counter() - t0:.1f} s", flush=True)
    return a, b


def status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def run_soup(a: Path, b: Path, dest: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "olmo_cli.train_main", "soup", str(a), str(b), "--destination", str(dest)]
    report = dest.parent / "maxrss.txt"
    t0 = time.perf_counter()
    wrapper = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(report), *cmd])
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children")
    while wrapper.poll() is None:
        try:
            pids = [int(p) for p in children.read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            pids = []
        for pid in pids:
            for k, v in status(pid).items():
                peak[k] = max(peak[k], v)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    maxrss_kib, rc = report.read_text().split()
    if int(rc) != 0:
        raise SystemExit(f"soup failed with status {rc}")
    return {"wall_s": wall, "maxrss": int(maxrss_kib) * 1024.0, **{k: float(v) for k, v in peak.items()}}


def check(a: Path, b: Path, dest: Path, names: list[str]) -> float:
    from olmo_train.checkpoint import safety

    soup = torch.load(dest / "model.pt", mmap=True, weights_only=True)
    first = torch.load(a / "model.pt", mmap=True, weights_only=True)
    worst = 0.0
    for name in names:
        holder = {"model": {name: torch.empty_like(soup[name])}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            safety.load_sharded(b, holder)
        expected = (first[name].double() + holder["model"][name].double()) / 2
        worst = max(worst, float((soup[name].double() - expected).abs().max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "olmo2-1b.yaml")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    cfg, shapes = shapes_of(args.config)
    params = sum(s.numel() for s in shapes.values())
    largest = max(shapes, key=lambda n: shapes[n].numel())
    tmp = Path(tempfile.mkdtemp(prefix="soup-bench-", dir=args.tmp))
    try:
        a, b = build_parents(tmp, cfg, shapes)
        got = run_soup(a, b, tmp / "soup")
        worst = check(a, b, tmp / "soup", [largest, *list(shapes)[1:3]])
    finally:
        if not os.environ.get("SOUP_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    model_gib = params * 4 / GiB
    tensor_gib = shapes[largest].numel() * 4 / GiB
    print(f"model: {params:,} parameters, {model_gib:.2f} GiB fp32; largest tensor {largest} {tensor_gib:.2f} GiB")
    print(
        f"soup of 2 (A unsharded, B sharded): {got['wall_s']:.1f} s | peak RSS {got['maxrss'] / GiB:.2f} GiB "
        f"(sampled: VmRSS {got['VmRSS'] / GiB:.2f}, RssAnon {got['RssAnon'] / GiB:.2f}, "
        f"RssFile {got['RssFile'] / GiB:.2f} GiB) = {got['maxrss'] / GiB / tensor_gib:.2f}x the largest tensor, "
        f"{got['maxrss'] / GiB / model_gib:.2f}x one model | max |soup - mean| on 3 tensors {worst:.2e}"
    )


if __name__ == "__main__":
    main()
