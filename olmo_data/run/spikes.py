"""Loss spikes of a run and the data that made them.

A step is a spike when its train/loss is at least `z` standard deviations above the mean of the `window` steps
before it (the rolling baseline). For each spike the per-instance loss record (`olmo_data.run.instance_loss`) says how
much each instance added to the jump: (its loss sum - baseline x its supervised tokens) / the step's supervised
tokens. These shares add up exactly to (step loss - baseline), so the first few name the data the jump came from;
their documents and sources are found as `inspect-batch` finds them.

Reads the save folder's files (config.yaml, metrics.jsonl, instance_loss.bin) with numpy alone, never the trainer.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from olmo_data.dataset import DocumentSpan
from olmo_data.errors import DataError
from olmo_data.run.batches import inspect_batch
from olmo_data.run.instance_loss import step_losses
from olmo_data.run.layout import INSTANCE_LOSS, METRICS, run_files
from olmo_data.run.open import check_own_records, read_run
from olmo_data.run.reader import RunData


@dataclass
class Contributor:
    position: int  # in the global batch
    instance: int
    source: str
    loss: float | None  # per supervised token
    supervised_tokens: int
    contribution: float  # to the step's loss above the baseline
    path: str
    token_offset: int
    documents: list[DocumentSpan] | None


@dataclass
class Spike:
    step: int
    loss: float
    baseline: float
    std: float
    z: float
    contributors: list[Contributor] = field(default_factory=list)


@dataclass
class SpikeReport:
    run: str
    window: int
    z: float
    steps: int  # steps with a train/loss in metrics.jsonl
    loss_record: str | None  # instance_loss.bin, None when the run has none
    spikes: list[Spike] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for spike in out["spikes"]:  # inf (a flat baseline, a NaN/inf loss) and NaN are not JSON: null
            for key in ("z", "loss", "baseline", "std"):
                spike[key] = spike[key] if math.isfinite(spike[key]) else None
            spike["finite"] = spike["loss"] is not None
            for c in spike["contributors"]:
                for key in ("loss", "contribution"):
                    c[key] = c[key] if c[key] is None or math.isfinite(c[key]) else None
        return out


def read_losses(path: str) -> dict[int, float]:
    """train/loss by step from a metrics.jsonl (a line cut short by a kill, and a record of no step, such as the
    eval_on_start ones, are skipped)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: not found; the run has logged no steps yet (or this is not its save folder)")
    out: dict[int, float] = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or type(record.get("step")) is not int:
                continue
            if isinstance(record.get("train/loss"), (int, float)):
                out[record["step"]] = float(record["train/loss"])
    return out


def find_spikes(run: str, *, window: int = 20, z: float = 3.0, top: int = 5) -> SpikeReport:
    """The spikes of RUN (save folder or config) and, for each, the `top` instances that added most to it."""
    if window < 2:
        raise DataError(f"--window {window}: the baseline needs at least 2 earlier steps")
    if top < 0:
        raise DataError(f"--top {top}: expected 0 or more instances per spike")
    if not math.isfinite(z):  # a NaN threshold compares false: "0 spikes" said nothing
        raise DataError(f"--z {z}: expected a positive, finite number of standard deviations (e.g. 3)")
    check_own_records(run, "spikes", f"loss and per-instance loss records ({METRICS}, {INSTANCE_LOSS})")
    config_path, folder = run_files(run)
    losses = read_losses(os.path.join(folder, METRICS))
    record = os.path.join(folder, INSTANCE_LOSS)
    report = SpikeReport(run, window, z, len(losses), record if os.path.isfile(record) else None)
    steps = sorted(losses)
    finite: list[float] = []  # the losses the baseline is made of: a NaN or inf would poison every later one
    for step in steps:
        loss = losses[step]
        base = np.array(finite[-window:])
        mean, std = (float(base.mean()), float(base.std())) if len(base) else (math.nan, math.nan)
        if not math.isfinite(loss):  # a diverged step is always a spike, with or without a baseline
            report.spikes.append(Spike(step, loss, mean, std, math.inf))
            continue
        finite.append(loss)
        if len(base) < window:
            continue
        score = (loss - mean) / std if std > 0 else (math.inf if loss > mean else 0.0)
        if score >= z:
            report.spikes.append(Spike(step, loss, mean, std, score))
    if report.loss_record is not None and top and report.spikes:
        data = read_run(config_path)
        for spike in report.spikes:
            spike.contributors = _contributors(data, folder, spike, top)
    return report


def _contributors(data: RunData, folder: str, spike: Spike, top: int) -> list[Contributor]:
    rows = step_losses(os.path.join(folder, INSTANCE_LOSS), spike.step)
    if rows is None or rows.tokens.sum() == 0:
        return []
    baseline = spike.baseline if math.isfinite(spike.baseline) else 0.0
    with np.errstate(invalid="ignore"):  # a row whose loss is NaN/inf is what made a non-finite step: first
        shares = np.where(
            np.isfinite(rows.loss_sum), (rows.loss_sum - baseline * rows.tokens) / rows.tokens.sum(), np.inf
        )
    order = [int(p) for p in np.argsort(-shares, kind="stable")[:top] if shares[p] > 0]
    if not order:
        return []
    batch = inspect_batch(data.config, step=spike.step, save_folder=folder, positions=order, run=data)
    labels = data.source_labels([i.instance for i in batch.instances])
    return [
        Contributor(
            position=i.position,
            instance=i.instance,
            source=label,
            loss=i.loss,
            supervised_tokens=int(rows.tokens[i.position]),
            contribution=float(shares[i.position]),
            path=i.path,
            token_offset=i.token_offset,
            documents=i.documents,
        )
        for i, label in zip(batch.instances, labels, strict=True)
    ]


def format_spikes(report: SpikeReport) -> str:
    """The text `olmo-data spikes` prints."""
    r = report
    lines = [
        f"{r.run}: {r.steps} steps of train/loss; a spike is a loss >= {r.z:g} standard deviations above the mean "
        f"of the {r.window} steps before it: {len(r.spikes)} found"
    ]
    if r.loss_record is None and r.spikes:
        lines.append(f"(no {INSTANCE_LOSS} in the save folder: the instances behind each spike cannot be named)")
    for s in r.spikes:
        score = f"{s.z:.1f}" if math.isfinite(s.z) else "inf (flat baseline)"
        if not math.isfinite(s.loss):
            score = "- (the loss is not a finite number: the step diverged)"
        lines.append(f"step {s.step}: loss {s.loss:.4f}, baseline {s.baseline:.4f} ± {s.std:.4f}, z {score}")
        if s.contributors and not math.isfinite(s.loss):
            lines.append("  instances with a non-finite loss first, then those adding most above the baseline:")
        elif s.contributors:
            lines.append(f"  instances adding most to the jump of {s.loss - s.baseline:+.4f}:")
        for c in s.contributors:
            loss = "-" if c.loss is None else f"{c.loss:.4f}"
            lines.append(
                f"  [{c.position}] instance {c.instance} (source {c.source}): loss {loss} over {c.supervised_tokens} "
                f"tokens, {c.contribution:+.4f} to the step's loss; {c.path} @ token {c.token_offset}"
            )
            for d in c.documents or []:
                lines.append(
                    f"      doc {d.id!r} from {d.src} line {d.loc}: instance tokens [{d.instance_start}, "
                    f"{d.instance_end})"
                )
    return "\n".join(lines)
