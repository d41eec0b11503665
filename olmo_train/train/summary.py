"""The block a run ends with: what it did (steps, tokens, time, speed, final loss), what it left (checkpoints),
and what to run next on it. One place to look when a run is done, instead of scrolling back through step lines."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from olmo_train.checkpoint import CONFIG, LATEST, list_checkpoints
from olmo_train.train.metrics import format_duration


@dataclass
class RunSummary:
    """What one invocation of the trainer did (a resumed run counts only its own steps)."""

    status: str  # finished, preempted, stopped (stop_at)
    save_folder: str  # as the config gives it: the paths shown are ones the user can type
    first_step: int  # the first step this invocation trained
    last_step: int
    total_steps: int
    tokens: int  # trained by this invocation
    tokens_seen: int  # by the run, all invocations
    seconds: float
    final_loss: float | None
    checkpoints: list[str] = field(default_factory=list)

    def text(self) -> str:
        steps = self.last_step - self.first_step + 1
        speed = self.tokens / self.seconds if self.seconds > 0 else 0.0
        lines = [  # the first line's form is what the Slurm scripts look for ("preempted at step N,")
            f"{self.status} at step {self.last_step}, {self.tokens_seen} tokens seen (the run has "
            f"{self.total_steps} steps)",
            f"  trained steps {self.first_step}..{self.last_step} ({steps} steps, {self.tokens:,} tokens) in "
            f"{format_duration(self.seconds)}: {speed:,.0f} tokens/s",
        ]
        if self.final_loss is not None:
            lines.append(f"  final loss {self.final_loss:.4f} (step {self.last_step})")
        lines.append("  checkpoints: " + (", ".join(self.checkpoints) or "none written by this run"))
        folder = shlex.quote(self.save_folder)
        config = shlex.quote(f"{self.save_folder.rstrip('/')}/{CONFIG}")
        latest = shlex.quote(f"{self.save_folder.rstrip('/')}/{LATEST}")
        lines += [
            "  next:",
            f"    olmo-data inspect-batch {config} --step {self.last_step} --decode   # the data of a step",
            f"    olmo-data spikes {folder}   # loss spikes and the instances behind them",
            f"    olmo-train generate {latest} --prompt 'def '   # text from the last checkpoint",
        ]
        if self.status != "finished":
            lines.append(f"    olmo-train train {config}   # continue from the last checkpoint")
        return "\n".join(lines)


def summarize(
    status: str,
    save_folder: str,
    first_step: int,
    last_step: int,
    total_steps: int,
    tokens: int,
    tokens_seen: int,
    seconds: float,
    final_loss: float | None,
) -> RunSummary:
    """The summary of a run, with the checkpoints of its steps that the save folder still holds (older ones
    may have been pruned by save_num_checkpoints_to_keep)."""
    kept = [
        f"{save_folder.rstrip('/')}/{path.name}"
        for step, _, path in list_checkpoints(save_folder)
        if step >= first_step
    ]
    return RunSummary(
        status, save_folder, first_step, last_step, total_steps, tokens, tokens_seen, seconds, final_loss, kept
    )
