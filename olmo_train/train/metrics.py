"""Where training metrics go: the console, `save_folder/metrics.jsonl`, and Weights & Biases when configured.

metrics.jsonl holds one JSON object per step. A resumed run first drops the entries after the checkpoint it
resumes from (steps that will be trained again) and then appends, so the file never holds a step twice and
always reads as one run, however many times it was stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
from pathlib import Path
from typing import Any

from olmo_data.errors import DataError
from olmo_data.io import atomic_path
from olmo_train.checkpoint import space
from olmo_train.config import TrainConfig, config_to_dict

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


class MetricsLog:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self._file: Any = None
        self._wandb: Any = None

    def start(self, resume_step: int) -> None:
        """Keep the entries of steps up to `resume_step` (those the checkpoint contains), then append."""
        if not self.enabled:
            return
        kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= resume_step]
        if self.path.exists() or kept:
            with atomic_path(self.path) as tmp:
                tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
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
        try:  # a full disk is met here, by rank 0 alone (torchrun then ends the other ranks)
            with space.refused_writes(self.path.parent, f"{self.path.name} (step {record['step']})"):
                self._file.write(json.dumps(record, sort_keys=True) + "\n")
                self._file.flush()
        except DataError:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):  # closed now, its unwritten rest dropped: `close` would fail again
                file.close()
            raise
        if self._wandb is not None:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
            self._wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def console_line(record: dict[str, Any], total_steps: int, eta_s: float | None = None) -> str:
    """One log line per console_log_interval steps: where the run is, how it trains, and when it will be done."""
    done = f"{100 * record['step'] / total_steps:.0f}%" if total_steps else "?"
    parts = [f"step {record['step']}/{total_steps} ({done})", f"loss {record['train/loss']:.4f}"]
    parts.append(f"lr {record['optim/lr']:.3g}")
    if "optim/grad_norm" in record:
        parts.append(f"gnorm {record['optim/grad_norm']:.3f}")
    parts.append(f"tok/s {record['throughput/tokens_per_second']:,.0f}")
    if "throughput/mfu" in record:
        parts.append(f"mfu {100 * record['throughput/mfu']:.1f}%")
    parts.append(f"tokens {record['train/tokens_seen']:,}")
    if eta_s is not None:
        parts.append(f"eta {format_duration(eta_s)}")
    for key, value in record.items():
        if key.startswith("eval/") and isinstance(value, float) and math.isfinite(value):
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
