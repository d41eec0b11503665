"""`olmo-train eval`: OLMo's downstream tasks on any model this project loads, in one process or under torchrun.

The model comes from `olmo_train.convert.load_model` (our checkpoints sharded or not, `transformers` directories,
OLMo's checkpoints), the tasks and metrics from ai2-olmo-eval through `olmo_train.train.downstream`, so the values
are the ones the loop logs for the same weights. Under torchrun each rank holds the whole model and takes
alternate batches; the metric gathers them (each request counted once).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from olmo_data.display import Stages
from olmo_data.errors import DataError
from olmo_train.checkpoint import CONFIG, read_config, recorded_tokenizer
from olmo_train.convert import load_model
from olmo_train.distributed import device_named, init_distributed, shutdown
from olmo_train.train.downstream import (
    Timing,
    build_tasks,
    check_labels,
    check_vocab,
    eval_tokenizer,
    evaluate_tasks,
    load_identified,
)


@dataclass
class EvalReport:
    """{label: {metric: value}}, with what it took."""

    results: dict[str, dict[str, float]]
    questions: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    load_seconds: float = 0.0
    world_size: int = 1
    is_main: bool = True

    def table(self) -> str:
        """One row per (task, metric), aligned for a terminal."""
        rows = [("task", "metric", "value", "questions")]
        for label, values in self.results.items():
            for key, value in values.items():
                rows.append((label, key, f"{value:.4f}", str(self.questions.get(label, ""))))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)

    def as_json(self) -> dict[str, Any]:
        return {
            "results": self.results,
            "questions": self.questions,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "world_size": self.world_size,
        }


def evaluate_model(
    model_path: str,
    labels: list[str],
    *,
    batch_size: int = 16,
    max_batches: int | None = None,
    tokenizer: str | None = None,
    device: str | None = None,
    seq_len: int | None = None,
    progress: bool | None = None,
    loading: Stages | None = None,
) -> EvalReport:
    """Every metric ai2-olmo-eval computes for `labels` on the model at `model_path`. `max_batches` caps each
    task's batches (all ranks together, so any process count gives the same values); `tokenizer` replaces the one
    the model or its data records; bf16 autocast on GPUs. Bars (`progress`): the loading stages (model,
    tokenizer, each task; `loading`, when the caller opened it before importing torch), then the batches."""
    loading = loading or Stages("loading", ["model", "tokenizer", *labels], progress=progress)
    distributed = "RANK" in os.environ
    d = init_distributed() if distributed else None
    try:
        check_labels(labels, "--tasks")
        where = device_named(device) if device else (d.device if d else _default_device())
        t0 = time.perf_counter()
        loading.start("model")
        model, own = load_model(model_path, device=where)
        loading.start("tokenizer")
        if tokenizer:
            given = load_identified(tokenizer)
            check_vocab(given, model.cfg, f"--tokenizer {tokenizer}")
            tok = eval_tokenizer(given, eos_token_id=model.cfg.eos_token_id)
        else:  # as the loop: a BOS before each prompt when the training documents began with one
            check_vocab(own, model.cfg, f"{model_path}: its tokenizer")
            tok = eval_tokenizer(own, eos_token_id=model.cfg.eos_token_id, **_recorded_bos(model_path))
        ctx = seq_len or model.cfg.max_sequence_length
        rank, world = (d.rank, d.world_size) if d else (0, 1)
        tasks = []
        for label in labels:  # one by one: each is a stage of the loading bar (a large task takes seconds)
            loading.start(label)
            tasks += build_tasks([label], tok, ctx, batch_size, max_batches, rank, world)
        loading.close()
        load_s = time.perf_counter() - t0
        timing = Timing()
        results = evaluate_tasks(model, tasks, where, bf16=where.type == "cuda", timing=timing, progress=progress)
        return EvalReport(
            results,
            {t.label: t.docs for t in tasks},
            {t.label: t.requests for t in tasks},
            timing.seconds,
            load_s,
            world,
            rank == 0,
        )
    except BaseException as e:
        loading.close(finished=False)
        if isinstance(e, RuntimeError) and "out of memory" in str(e):
            raise DataError(f"{model_path}: out of memory evaluating; lower --batch-size ({batch_size})") from e
        raise
    finally:
        if distributed:
            shutdown()


def _recorded_bos(model_path: str) -> dict[str, int | None]:
    """{"bos_token_id": the BOS the data manifests record} for a checkpoint of ours whose data is here; else {}
    (the tokenizer's own BOS is used)."""
    path = Path(model_path)
    try:
        identity = recorded_tokenizer(read_config(path)) if (path / CONFIG).is_file() else None
    except DataError:
        return {}
    return {"bos_token_id": identity.get("bos_token_id")} if identity else {}


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
