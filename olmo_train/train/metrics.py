"""Where training metrics go: the console, `save_folder/metrics.jsonl`, and Weights & Biases when configured.

metrics.jsonl holds one JSON object per step, and is only ever appended to: no run cuts or rewrites a file that
another wrote. A run continues it when it holds exactly the steps up to the checkpoint resumed from (the usual
stop or preemption, which saves at its last step); otherwise (steps after that checkpoint, which will be trained
again, a line cut short by a kill, or a previous run's records before a fresh start) the file is set aside whole
as metrics.N.jsonl and the new metrics.jsonl begins with a copy of the records up to the checkpoint. So the file
never holds a step twice and always reads as one run, however many times it was stopped, and every line any run
wrote is still on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from olmo_data.config import TrainConfig, config_to_dict
from olmo_data.errors import DataError
from olmo_data.io import atomic_path
from olmo_train.checkpoint import metrics_aside, space

log = logging.getLogger("olmo_train")

# bf16 dense peak FLOP/s per GPU, for the MFU estimate (matched against torch.cuda.get_device_name())
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def peak_flops(cfg: TrainConfig, device_name: str | None) -> float | None:
    if cfg.peak_flops_per_device:
        return cfg.peak_flops_per_device
    if device_name:
        for key, flops in PEAK_FLOPS.items():
            if key in device_name:
                return flops
    return None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The complete records of a metrics.jsonl (a line cut short by a kill is skipped)."""
    out = []
    p = Path(path)
    if p.is_file():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _step_of(line: str) -> int:
    """The step of a complete record line; -1 for anything else (a line cut short by a kill)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def free_aside(path: Path, aside_name: Callable[[int], str]) -> Path:
    """The first `aside_name(N)` beside `path` not taken (N = 1, 2, ...): earlier files keep their names, the
    latest set aside has the highest N."""
    n = 1
    while path.with_name(aside_name(n)).exists():
        n += 1
    return path.with_name(aside_name(n))


def copy_aside(path: Path, aside: Path) -> None:
    """`aside` as a second name of `path`'s file (a hard link: nothing copied, and no moment without either), or
    a copy where the filesystem has no hard links."""
    try:
        os.link(path, aside)
    except OSError:
        with atomic_path(aside) as tmp:
            shutil.copyfile(path, tmp)


class AppendOnlyLog:
    """A save-folder file that rank 0 only ever appends to, a step at a time (metrics.jsonl, instance_loss.bin):
    each append flushed, a full disk one line naming the file and the step (after which the file is closed, its
    unwritten rest dropped, so that `close` does not fail again). Subclasses open `_file` in their `start`."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self._file: Any = None

    def append(self, data: str | bytes, step: int) -> None:
        try:  # a full disk is met here, by rank 0 alone (torchrun then ends the other ranks)
            with space.refused_writes(self.path.parent, f"{self.path.name} (step {step})"):
                self._file.write(data)
                self._file.flush()
        except DataError:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class MetricsLog(AppendOnlyLog):
    def __init__(self, path: Path, enabled: bool) -> None:
        super().__init__(path, enabled)
        self._wandb: Any = None

    def start(self, resume_step: int) -> None:
        """Append after the records of steps up to `resume_step` (those the checkpoint contains); a file holding
        anything else is set aside whole first (see the module's docstring)."""
        if not self.enabled:
            return
        with space.refused_writes(self.path.parent, self.path.name):
            self._start(resume_step)

    def _start(self, resume_step: int) -> None:
        text = self.path.read_text() if self.path.is_file() else ""
        first = 0 if resume_step else 1  # step 0: the evaluation before training (eval_on_start) of this run
        kept = [line + "\n" for line in text.splitlines() if first <= _step_of(line) <= resume_step]
        if text != "".join(kept):
            aside = free_aside(self.path, metrics_aside)
            copy_aside(self.path, aside)
            with atomic_path(self.path) as tmp:
                tmp.write_text("".join(kept))
            if resume_step:
                what = f"records past step {resume_step}, where this run resumes (or a line cut short)"
                goes_on = f"keeps steps 1..{resume_step} and continues"
            else:
                what, goes_on = "an earlier run's records, and this run starts at step 1", "starts empty"
            log.warning("%s holds %s: kept whole as %s; %s %s", self.path, what, aside.name, self.path.name, goes_on)
        self._file = self.path.open("a")

    def start_wandb(self, cfg: TrainConfig, run_id: str | None) -> str | None:
        """Start (or continue, with the same run id) a wandb run; returns the run id to store in
        checkpoints."""
        if not (self.enabled and cfg.wandb.enabled):
            return run_id
        import wandb

        run_id = run_id or secrets.token_hex(4)  # wandb run ids: lowercase letters and digits
        self._wandb = wandb.init(
            id=run_id,
            resume="allow",
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            group=cfg.wandb.group,
            name=cfg.wandb.name or cfg.run_name,
            tags=cfg.wandb.tags,
            mode=cfg.wandb.mode,  # type: ignore[arg-type]
            dir=str(self.path.parent),
            config=config_to_dict(cfg),
        )
        return run_id

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.append(json.dumps(record, sort_keys=True) + "\n", record["step"])
        if self._wandb is not None:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
            self._wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        super().close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def console_line(record: dict[str, Any], total_steps: int, eta_s: float | None = None) -> str:
    """One log line per console_log_interval steps: where the run is, how it trains, and when it will be done."""
    done = f"{100 * record['step'] / total_steps:.0f}%" if total_steps else "?"
    parts = [f"step {record['step']}/{total_steps} ({done})", f"loss {record['train/loss']:.4f}"]
    if "train/z_loss" in record:  # z-loss on: the optimized loss is loss + z_loss
        parts.append(f"z_loss {record['train/z_loss']:.4g}")
    parts.append(f"lr {record['optim/lr']:.3g}")
    if "optim/grad_norm" in record:
        parts.append(f"gnorm {record['optim/grad_norm']:.3f}")
    parts.append(f"tok/s {record['throughput/tokens_per_second']:,.0f}")
    if "throughput/mfu" in record:
        parts.append(f"mfu {100 * record['throughput/mfu']:.1f}%")
    parts.append(f"tokens {record['train/tokens_seen']:,}")
    if eta_s is not None:
        parts.append(f"eta {format_duration(eta_s)}")
    for key, value in record.items():  # downstream tasks (tens of metrics each) have a line of their own
        if (
            key.startswith("eval/")
            and not key.startswith("eval/downstream/")
            and isinstance(value, float)
            and math.isfinite(value)
        ):
            parts.append(f"{key} {value:.4f}")
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """12s, 4m05s, 3h07m: short enough for a log line, precise enough to plan by."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
