"""A run's curves as a PNG, for reports and papers (`olmo-data spikes --plot`, `olmo-data view --plot`).

The one module that imports matplotlib (the `view` extra); drawn from the same answers as the web view's charts.
"""

from __future__ import annotations

import math
import os
from typing import Any

from olmo_view.answers import DataError, RunAnswers, SpikeReport, write_atomically

__all__ = ["FORMATS", "plot_run", "plot_spikes"]

FORMATS = (".png", ".pdf", ".svg")


def _pyplot(out: str) -> Any:
    if not out.lower().endswith(FORMATS):
        raise DataError(f"--plot {out}: expected a file name ending in {', '.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise DataError(f"--plot {out}: the folder {folder} does not exist; create it first")
    try:
        import matplotlib
    except ImportError:
        raise DataError("--plot draws with matplotlib, which is not installed: pip install 'olmo-data[view]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _loss_axes(ax: Any, steps: list[int], losses: list[float], report: SpikeReport | None) -> None:
    ax.plot(steps, losses, linewidth=1.2, color="#0b62c4", label="train/loss")
    if report is not None and report.spikes:
        top = max((v for v in losses if math.isfinite(v)), default=0.0)
        xs = [s.step for s in report.spikes]
        ys = [s.loss if math.isfinite(s.loss) else top for s in report.spikes]
        ax.scatter(xs, ys, color="#c8321f", zorder=3, s=28, label=f"spikes (z ≥ {report.z:g}, window {report.window})")
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(str(x), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#c8321f")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)


def plot_spikes(answers: RunAnswers, out: str, report: SpikeReport | None = None) -> str:
    """train/loss over steps with the spikes `olmo-data spikes` finds (`report`, or the view's) marked and
    labelled by step."""
    plt = _pyplot(out)
    curves = answers.curves()
    if "train/loss" not in curves:
        raise DataError(f"{answers.folder}: the run logged no train/loss to plot")
    fig, ax = plt.subplots(figsize=(9, 3.6))
    _loss_axes(ax, *curves["train/loss"], report if report is not None else answers.spikes())
    ax.set_xlabel("step")
    ax.set_title(f"{answers.name}: train/loss and its spikes", fontsize=10)
    fig.tight_layout()
    return _save(plt, fig, out)


def plot_run(answers: RunAnswers, out: str) -> str:
    """The Run page's curves, one panel each: loss with spikes, z-loss, loss per source, learning rate."""
    plt = _pyplot(out)
    curves = answers.curves()
    if "train/loss" not in curves:
        raise DataError(f"{answers.folder}: the run logged no train/loss to plot")
    sources = sorted(k for k in curves if k.startswith("train/source/"))
    panels = ["loss"] + (["z"] if "train/z_loss" in curves else []) + (["sources"] if sources else [])
    panels += ["lr"] if "optim/lr" in curves else []
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True, squeeze=False)
    try:
        report: SpikeReport | None = answers.spikes()
    except DataError:
        report = None
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if panel == "loss":
            _loss_axes(ax, *curves["train/loss"], report)
            ax.set_title(f"{answers.name}", fontsize=10)
        elif panel == "z":
            ax.plot(*curves["train/z_loss"], linewidth=1.2, color="#e07b00")
            ax.set_ylabel("z-loss")
        elif panel == "sources":
            for key in sources:
                ax.plot(*curves[key], linewidth=1.0, label=key.removeprefix("train/source/").removesuffix("/loss"))
            ax.set_ylabel("loss per source")
            ax.legend(fontsize=7, loc="upper right")
        else:
            ax.plot(*curves["optim/lr"], linewidth=1.2, color="#2a9d3c")
            ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return _save(plt, fig, out)


def _save(plt: Any, fig: Any, out: str) -> str:
    try:
        with write_atomically(out) as tmp:
            fig.savefig(tmp, format=os.path.splitext(out)[1][1:].lower(), dpi=150)
    except OSError as e:
        raise DataError(f"--plot {out}: cannot write it ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return out
