"""The training loop: resume, step, log, evaluate, checkpoint, and stop cleanly when asked.

A run is a function of (config, data, step): the batch of a step comes from the data order, the learning rate
from the step, the token count from the step. So a resumed run, on any world size, continues exactly where the
checkpoint left it, and a preempted job can simply be started again with the same command.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn

from olmo_data.config import TrainConfig, check_schedule_fits, load_config, save_config
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.distributed import (
    Dist,
    all_reduce_sum,
    autocast,
    barrier,
    gradient_sync,
    init_distributed,
    parallelize,
    raise_together,
    shutdown,
    tell_launcher,
)
from olmo_train.nn import Transformer, check_trainable, doc_ids_from_starts, float8, lora
from olmo_train.optional import quiet
from olmo_train.train import relora as relora_regime
from olmo_train.train import restart
from olmo_train.train.data import Batch, EvalBatch, TrainData, eval_batches, labels_for
from olmo_train.train.downstream import Downstream, start_downstream
from olmo_train.train.instance_losses import InstanceLossLog, gather_rows, source_metrics
from olmo_train.train.metrics import MetricsLog, console_line, peak_flops
from olmo_train.train.optim import build_optimizer, learning_rate, set_learning_rate
from olmo_train.train.relora import RELORA_LOAD
from olmo_train.train.reproducible import make_reproducible
from olmo_train.train.summary import summarize

log = logging.getLogger("olmo_train")


class Preemption:
    """SIGTERM / SIGUSR1 (Slurm's warning before preemption) ask the run to checkpoint and exit at the next
    step. The previous handlers come back when the run ends, so a caller (a test, a notebook) is not left with
    a process that ignores SIGTERM."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.requested = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    supervised_tokens: int
    stop_requested: bool
    z_loss: float | None = None  # per supervised token, like loss; None: z_loss_multiplier is off
    masked_instances: int = 0  # all ranks' instances caught by data.instance_filter
    lock_lost: bool = False  # another run took the save folder's lock over (rank 0 saw it; every rank knows)
    # every instance of the global batch, by position: its cross-entropy sum and supervised tokens (rank 0 writes
    # them to instance_loss.bin; every rank has them)
    instance_loss_sum: np.ndarray | None = None
    instance_tokens: np.ndarray | None = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, d: Dist) -> tuple[nn.Module, Transformer]:
    """The same initial weights on every rank (same seed, built on CPU), then sharded or replicated."""
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model)
    lora.add_adapters(model, cfg)  # ReLoRA (relora.rank): the block linears train through adapters
    float8.convert(model, cfg, d.device)  # float8.enabled: the block linears compute in fp8 (before compile/FSDP)
    return parallelize(model, cfg, d), model


def forward_loss_sum(
    model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, doc_starts: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of the cross-entropy of every supervised target token (labels -100 are skipped), computed inside the
    model's forward (where FSDP has the output head gathered) a chunk of tokens at a time; with `doc_starts`
    (model.document_masking: `olmo_train.train.documents.DocumentStarts`), attention stays within documents."""
    doc_ids = doc_ids_from_starts(doc_starts) if doc_starts is not None else None
    return model(input_ids, labels=labels, doc_ids=doc_ids)


def forward_instance_losses(
    model: nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    doc_starts: torch.Tensor | None = None,
    z_loss_multiplier: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The training forward: `forward_loss_sum`'s cross-entropy sum (to float32 rounding, see `olmo_train.nn.loss`),
    with `z_loss_multiplier` the z-loss sum over the same tokens and chunks (else None), and each row's
    cross-entropy sum (float64, detached), so that every step records the loss of each of its instances."""
    doc_ids = doc_ids_from_starts(doc_starts) if doc_starts is not None else None
    ce, z, rows = model(
        input_ids, labels=labels, doc_ids=doc_ids, z_loss_multiplier=z_loss_multiplier, instance_losses=True
    )
    return ce, z, rows


def train_step(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    batch: Batch,
    cfg: TrainConfig,
    d: Dist,
    stop_flag: bool,
    lock_lost: bool = False,
) -> StepResult:
    """One optimizer step over this rank's part of the global batch, in micro-batches.

    The loss is the sum of token losses over the whole global batch divided by the global number of supervised
    tokens, so it does not depend on how the batch is split over ranks and micro-batches. Data-parallel
    wrappers average gradients over ranks, hence the factor world_size. The z-loss (z_loss_multiplier) is
    normalized the same way and added to the optimized loss; the result reports the two apart.
    """
    input_ids = batch.input_ids.to(d.device, non_blocking=True)
    labels = labels_for(batch.input_ids, batch.label_mask, batch.instance_mask).to(d.device, non_blocking=True)
    doc_starts = batch.doc_starts.to(d.device, non_blocking=True) if batch.doc_starts is not None else None
    local_count = int((labels != -100).sum())  # without the instances data.instance_filter masked
    local_masked = int((~batch.instance_mask).sum()) if batch.instance_mask is not None else 0
    global_count, masked = all_reduce_sum([float(local_count), float(local_masked)], d.device)
    scale = d.world_size / max(global_count, 1.0)
    mbs = cfg.device_train_microbatch_size
    starts = list(range(0, input_ids.shape[0], mbs))
    loss_sum = torch.zeros((), dtype=torch.float64, device=d.device)
    z_sum = torch.zeros((), dtype=torch.float64, device=d.device)
    row_sums = []
    for i, start in enumerate(starts):
        with gradient_sync(model, enabled=i == len(starts) - 1), autocast(cfg, d.device):
            rows = slice(start, start + mbs)
            ce, z, row_sum = forward_instance_losses(
                model,
                input_ids[rows],
                labels[rows],
                doc_starts[rows] if doc_starts is not None else None,
                cfg.z_loss_multiplier,
            )
            ((ce if z is None else ce + z) * scale).backward()
        loss_sum += ce.detach().double()
        row_sums.append(row_sum)
        if z is not None:
            z_sum += z.detach().double()
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor of partial norms
        norm = norm.full_tensor()
    optim.step()
    float8.refresh_scales(model, cfg)  # fp8 all-gather: all weights' new scales in one all-reduce
    optim.zero_grad(set_to_none=True)
    local_rows = torch.stack([torch.cat(row_sums), (labels != -100).sum(-1).double()], dim=-1)
    instances = gather_rows(local_rows, d.world_size, batch.rank_blocks)  # (global batch, 2), by position
    total_loss, stop, total_z, lost = all_reduce_sum(
        [float(loss_sum), float(stop_flag), float(z_sum), float(lock_lost)], d.device
    )
    z_loss = total_z / max(global_count, 1.0) if cfg.z_loss_multiplier is not None else None
    return StepResult(
        total_loss / max(global_count, 1.0),
        float(norm),
        int(global_count),
        stop > 0,
        z_loss=z_loss,
        masked_instances=int(masked),
        instance_loss_sum=instances[:, 0],
        instance_tokens=instances[:, 1].astype(np.int64),
        lock_lost=lost > 0,
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, cfg: TrainConfig, d: Dist, sets: dict[str, list[EvalBatch]], tasks: Downstream | None = None
) -> dict[str, float]:
    """The loss on each validation set (read at start by `eval_batches`, by evaluator label), and the downstream
    tasks' metrics (olmo_train/train/downstream)."""
    out: dict[str, float] = tasks.evaluate(model, d.device) if tasks is not None else {}
    model.eval()
    for label, batches in sets.items():
        total, count = 0.0, 0.0
        for input_ids, mask, starts in batches:
            labels = labels_for(input_ids, mask).to(d.device)
            starts = starts.to(d.device) if starts is not None else None
            with autocast(cfg, d.device):
                total += float(forward_loss_sum(model, input_ids.to(d.device), labels, starts))
            count += float((labels != -100).sum())
        total, count = all_reduce_sum([total, count], d.device)
        out[f"eval/{label}/loss"] = total / max(count, 1.0)
        out[f"eval/{label}/supervised_tokens"] = int(count)
    model.train()
    return out


def check_resumable(state: ckpt.TrainerState, cfg: TrainConfig, data: TrainData, path: Path) -> None:
    """Refuse to continue a run on data (or batch size) other than the one its checkpoint was trained on."""
    problems = []
    if state.data_fingerprint and state.data_fingerprint != data.fingerprint:
        problems.append(f"data fingerprint {state.data_fingerprint} != {data.fingerprint} (data.paths/mix changed)")
    if state.global_train_batch_size and state.global_train_batch_size != cfg.global_train_batch_size:
        problems.append(f"global_train_batch_size {state.global_train_batch_size} != {cfg.global_train_batch_size}")
    if state.seed != cfg.seed:
        problems.append(f"seed {state.seed} != {cfg.seed} (the data order would change)")
    if problems and not cfg.force_load:
        raise DataError(
            f"{path}: the checkpoint was trained with other data settings: {'; '.join(problems)}. "
            "Restore them, use a new save_folder, set --restore_dataloader=false to start a new stage on this data "
            "(weights and optimizer kept), --reset_trainer_state to load only the weights, or --force_load to "
            "continue anyway"
        )
    for problem in problems:
        log.warning("continuing despite %s (force_load)", problem)


def resume(
    cfg: TrainConfig, model: nn.Module, optim: torch.optim.Optimizer, data: TrainData, d: Dist
) -> ckpt.TrainerState:
    """Continue from save_folder's latest complete checkpoint, else from load_path, else start fresh."""
    save_folder = Path(cfg.save_folder)
    fresh = ckpt.TrainerState(
        world_size=d.world_size,
        global_train_batch_size=cfg.global_train_batch_size,
        sequence_length=cfg.model.max_sequence_length,
        seed=cfg.seed,
        data_fingerprint=data.fingerprint,
        run_name=cfg.run_name,
    )
    own = ckpt.agree_on_checkpoint(ckpt.latest_checkpoint(save_folder) if d.is_main else None)
    if own is not None:
        log.info("resuming from %s", own)
        state = ckpt.read_trainer_state(own)
        check_resumable(state, cfg, data, own)
        state = ckpt.load_checkpoint(own, model, optim, d, hooks=RELORA_LOAD, model_config=cfg.model)
    elif cfg.load_path:  # OLMo's restart keys say what comes from it besides the weights (restart.py)
        path = ckpt.localize(cfg.load_path, d)
        if restart.plan(cfg).counters:
            check_resumable(ckpt.read_trainer_state(path), cfg, data, path)
        state, continues = restart.start_from(cfg, path, model, optim, fresh, d, RELORA_LOAD)
        if not continues:
            return state
    else:
        if cfg.relora.continue_from:
            relora_regime.continue_from(cfg, model, d)
        return fresh
    if state.world_size != d.world_size:
        log.info("the checkpoint was written by %d ranks; continuing on %d", state.world_size, d.world_size)
    state.world_size = d.world_size
    state.data_fingerprint = data.fingerprint
    return state


def save(
    kind: str,
    cfg: TrainConfig,
    model: nn.Module,
    optim: torch.optim.Optimizer,
    state: ckpt.TrainerState,
    d: Dist,
    background: ckpt.BackgroundSaves | None = None,
) -> None:
    """Save a checkpoint; with `save_async`, a sharded one is written in the background (`background`), its
    completion left to the next save or to the end of the run, and unsharded ones stay synchronous."""
    folder = Path(cfg.save_folder)
    t0 = time.perf_counter()
    if background is not None:
        background.wait()  # at most one save in flight, whatever its kind
    if kind == "sharded" and background is not None:
        tmp = background.start(folder, model, optim, state, cfg.save_num_checkpoints_to_keep, cfg)
        log.info("saving %s in the background (the loop blocked %.2fs)", tmp, time.perf_counter() - t0)
        return
    if kind == "sharded":
        path = ckpt.save_sharded(folder, model, optim, state, cfg.save_num_checkpoints_to_keep, d, cfg)
    else:
        keep = cfg.save_num_unsharded_checkpoints_to_keep
        path = ckpt.save_unsharded(folder, model, optim, state, keep, d, cfg, split=lora.split_state)
    log.info("saved %s in %.1fs", path, time.perf_counter() - t0)


def train(cfg: TrainConfig) -> int:
    """Run (or continue) the training the config describes; returns 0 when it finished, stopped or was
    preempted after saving."""
    d = init_distributed()
    preemption = Preemption()
    lock = ckpt.SaveFolderLock(Path(cfg.save_folder), cfg.save_folder_lock_timeout_s, enabled=d.is_main)
    try:
        return _train(cfg, d, preemption, lock)
    finally:  # finished, stopped, preempted or failed: the save folder is free for the next run
        lock.release()
        preemption.restore()
        shutdown()


def _train(cfg: TrainConfig, d: Dist, preemption: Preemption, lock: ckpt.SaveFolderLock) -> int:
    logging.basicConfig(
        level=logging.INFO if d.is_main else logging.WARNING,
        format=f"%(asctime)s [rank {d.rank}] %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    threads = make_reproducible(cfg.deterministic)  # the thread count, before the first matmul
    if cfg.model.document_masking:  # before anything is written
        check_trainable(cfg.model.document_attention, d.device)
    save_folder = Path(cfg.save_folder)
    created = not save_folder.exists()

    def claim() -> None:  # one writer per save folder: before anything is written (or removed) there
        if d.is_main:
            with ckpt.space.refused_writes(save_folder, "the save folder"):
                save_folder.mkdir(parents=True, exist_ok=True)
        lock.acquire()

    raise_together(claim)  # a refusal on rank 0 ends every rank with its line
    # leftovers of a killed save, `latest` made a directory by a copy: a refusal (an unverifiable copy) on every rank
    raise_together(lambda: ckpt.remove_stale_temporaries(save_folder) if d.is_main else None)
    seed_everything(cfg.seed)
    try:
        data = TrainData(cfg, d)  # with document_masking, it also resolves model.eos_token_id (saved below)
        model, inner = build_model(cfg, d)  # e.g. float8 refused on this machine
        # the validation sets are read now, so that a problem with them stops the run before its first step
        evaluators = cfg.evaluators if cfg.eval_interval or cfg.eval_on_start else []
        eval_sets: dict[str, list[EvalBatch]] = {}
        subset = cfg.eval_subset_num_batches if cfg.eval_subset_num_batches > 0 else None
        for ev in evaluators:  # by label, the first evaluator of a label, as before
            if ev.type == "lm" and ev.label not in eval_sets:
                eval_sets[ev.label] = eval_batches(replace(ev, max_batches=ev.max_batches or subset), cfg, d)
        last = min(data.total_steps(), cfg.stop_at or data.total_steps())
        check_schedule_fits(cfg, data.total_steps())  # a length in tokens or epochs is known in steps only now
        tasks = start_downstream(cfg, d, cfg.eval_on_start or bool(cfg.eval_interval and cfg.eval_interval <= last))
        optim = build_optimizer(model, cfg.optimizer)
        cfg.optimizer.fused = bool(optim.defaults["fused"])  # as resolved here: config.yaml records the kernel used
        state = resume(cfg, model, optim, data, d)  # e.g. a load_path that is not there
    except DataError:  # e.g. missing data: leave no empty save folder behind to puzzle over
        lock.release()
        if d.is_main and created and save_folder.is_dir() and not any(save_folder.iterdir()):
            save_folder.rmdir()
        raise
    if restart.pre_train_checkpoint_wanted(cfg, state):  # OLMo's: saving works, found out before step 1
        save("sharded", cfg, model, optim, state, d)
        restart.after_pre_train_save(save_folder / ckpt.step_dir(0, False) if d.is_main else None, optim)
    warmup_from = restart.bolt_on_start(cfg, state)  # reset_optimizer_state in a continuing run: lr warms up again
    if d.is_main:  # only once the resume checks passed: a refused run must not rewrite the run's config
        with ckpt.space.refused_writes(save_folder, ckpt.CONFIG):
            save_config(cfg, save_folder / ckpt.CONFIG)
    total_steps = data.total_steps()
    relora = relora_regime.ReLoRA.start(cfg, model, optim, total_steps, d)  # None unless relora.rank is set
    stop_step = min(total_steps, cfg.stop_at) if cfg.stop_at is not None else total_steps
    if state.step >= stop_step:  # a finished (or stopped at stop_at) run started again: say so, train nothing
        log.info(
            "nothing to train: the run is at step %d, and %s; %s",
            state.step,
            f"stop_at is {cfg.stop_at}" if stop_step < total_steps else f"max_duration is {total_steps} steps",
            "raise max_duration (or stop_at) to train further, or use a new save_folder",
        )
        data.close()
        barrier()
        return 0
    metrics = MetricsLog(save_folder / ckpt.METRICS, enabled=d.is_main)
    metrics.start(state.step)
    instance_log = InstanceLossLog(save_folder / ckpt.INSTANCE_LOSS, enabled=d.is_main)
    instance_log.start(state.step)  # as metrics.jsonl: the rows up to the checkpoint, then this run's
    state.wandb_run_id = metrics.start_wandb(cfg, state.wandb_run_id)
    L = cfg.model.max_sequence_length
    tokens_per_step = cfg.global_train_batch_size * L
    flops_per_token = inner.flops_per_token(L)
    peak = peak_flops(cfg, torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else None)
    total_tokens = total_steps * tokens_per_step
    log.info(
        "model: %.1fM parameters (%.1fM without embeddings) | world size %d (%s), %d intra-op thread%s each%s | "
        "data: %d instances of %d tokens, %d steps per epoch | training steps %d..%d of %d",
        inner.num_params() / 1e6,
        inner.num_params(include_embeddings=False) / 1e6,
        d.world_size,
        cfg.distributed_strategy,
        threads,
        "" if threads == 1 else "s",
        ", deterministic kernels" if cfg.deterministic else "",
        data.num_instances,
        L,
        data.batches_per_epoch,
        state.step + 1,
        stop_step,
        total_steps,
    )
    if cfg.eval_on_start and evaluators:  # before the first step of this run: logged at the step it starts from
        start = evaluate(model, cfg, d, eval_sets, tasks)
        metrics.write({"step": state.step, **start})
        losses = " | ".join(f"{k} {v:.4f}" for k, v in start.items() if not k.startswith("eval/downstream/"))
        log.info("evaluated at step %d, before training%s", state.step, f": {losses}" if losses else "")
    try:
        last_saved = {"sharded": state.step, "unsharded": -1}
        background = ckpt.BackgroundSaves(d) if cfg.save_async else None
        model.train()
        preempted, final_loss = False, None
        first_step, t_start = state.step + 1, time.perf_counter()
        while state.step < stop_step:
            step = state.step + 1
            t0 = time.perf_counter()
            batch = data.batch(step)
            progress = step if cfg.scheduler.units == "steps" else step * tokens_per_step
            total = total_steps if cfg.scheduler.units == "steps" else total_tokens
            lr = learning_rate(cfg.scheduler, cfg.optimizer.learning_rate, progress, total, cfg.relora)
            if warmup_from is not None:
                lr = restart.bolt_on_learning_rate(cfg, lr, warmup_from, step, tokens_per_step, total)
            set_learning_rate(optim, lr)
            result = train_step(model, optim, batch, cfg, d, preemption.requested, lock.lost_to is not None)
            if result.lock_lost:  # on every rank, before this step writes anything
                raise DataError(
                    f"{save_folder / ckpt.WRITER_LOCK}: another run took this save folder over"
                    f"{f' ({lock.lost_to})' if lock.lost_to else ''} while this one was silent past "
                    f"save_folder_lock_timeout_s ({cfg.save_folder_lock_timeout_s:g} s); stopped at step {step} "
                    "without writing it, so that the two runs do not overwrite each other's checkpoints and metrics"
                )
            state.step = step
            state.epoch = batch.epoch
            state.tokens_seen += tokens_per_step
            state.instances_seen += (
                len(result.instance_tokens) if result.instance_tokens is not None else cfg.global_train_batch_size
            )
            dt = time.perf_counter() - t0
            record: dict[str, Any] = {
                "step": step,
                "train/loss": result.loss,  # the cross-entropy alone, with or without z-loss
                "train/tokens_seen": state.tokens_seen,
                "train/instances_seen": state.instances_seen,
                "train/epoch": state.epoch,
                "train/supervised_tokens": result.supervised_tokens,
                **({"train/masked_instances": result.masked_instances} if batch.instance_mask is not None else {}),
                "train/batch_fingerprint": batch.fingerprint,
                "optim/lr": lr,
                "optim/grad_norm": result.grad_norm,
                "throughput/tokens_per_second": tokens_per_step / dt,
            }
            if result.instance_loss_sum is not None and result.instance_tokens is not None:
                instance_log.write(step, result.instance_loss_sum, result.instance_tokens)
                if batch.sources is not None:  # rank 0: per source, averaging (token-weighted) to train/loss
                    labels = data.sources.labels
                    record.update(
                        source_metrics(labels, batch.sources, result.instance_loss_sum, result.instance_tokens)
                    )
            if result.z_loss is not None:  # z_loss_multiplier: the optimized loss is train/loss + train/z_loss
                record["train/z_loss"] = result.z_loss
            if relora is not None:  # adapter norms; after every merge_every-th step, the merge (before any save)
                record.update(relora.after_step(step))
            record["data/wait_s"] = batch.wait_s  # the step's wait for its batch: is the read-ahead keeping up?
            if data.remote:  # retried remote reads so far (this rank's, rank 0 reading the whole batch)
                record["data/remote_retries"] = data.remote_retries()
            if peak:
                record["throughput/mfu"] = flops_per_token * tokens_per_step / dt / (peak * d.world_size)
            if cfg.eval_interval and cfg.evaluators and step % cfg.eval_interval == 0:
                record.update(evaluate(model, cfg, d, eval_sets, tasks))
            metrics.write(record)
            final_loss = result.loss
            if d.is_main and (step % cfg.console_log_interval == 0 or step == stop_step):
                per_step = (time.perf_counter() - t_start) / (step - first_step + 1)  # saves and evals included
                log.info(console_line(record, total_steps, eta_s=per_step * (stop_step - step)))
            if cfg.save_interval and step % cfg.save_interval == 0:
                save("sharded", cfg, model, optim, state, d, background)
                last_saved["sharded"] = step
            if cfg.save_interval_unsharded and step % cfg.save_interval_unsharded == 0:
                save("unsharded", cfg, model, optim, state, d, background)
                last_saved["unsharded"] = step
            if result.stop_requested:
                log.warning("stop signal received: saving a checkpoint at step %d and exiting", step)
                preempted = True
                break
        if last_saved["sharded"] != state.step and last_saved["unsharded"] != state.step:
            save("sharded", cfg, model, optim, state, d, background)
        if background is not None:  # finished, stopped or preempted: the save in flight completed before exit
            background.wait()
    except Exception as e:  # a save in flight is removed, and named if its writes filled the disk
        if background is not None:
            background.abandon(e)
        raise
    finally:  # also on errors: stop the prefetch thread, flush metrics, end the wandb run
        data.close()
        metrics.close()
        instance_log.close()
    if d.is_main:  # one block: what the run did, what it left, what to run next
        done = "preempted" if preempted else ("finished" if state.step >= total_steps else "stopped (stop_at)")
        trained = (state.step - first_step + 1) * tokens_per_step
        ran = (done, cfg.save_folder, first_step, state.step, total_steps, trained, state.tokens_seen)
        log.info(summarize(*ran, time.perf_counter() - t_start, final_loss).text())
    barrier()
    return 0


USAGE = """usage: python -m olmo_train CONFIG.yaml [--key.sub=value ...]
       torchrun --nproc-per-node N -m olmo_train CONFIG.yaml [--key.sub=value ...]

Overrides use the config's dotted keys, e.g. --optimizer.learning_rate=1e-3 --data.paths=[a.npy,b.npy]
--max_duration=2e9T --stop_at=100 --load_path=runs/base/step1000 --reset_trainer_state.
`python -m olmo_train --keys` lists every key with its default and what it does."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--keys":
        from olmo_data.config import keys_text

        print(keys_text())
        return 0
    config_path, overrides = (None, args) if args[0].startswith("--") else (args[0], args[1:])
    rank = os.environ.get("RANK", "0")  # the config's own log line (an OLMo config's notes) from the first rank only
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(message)s",
        datefmt="%H:%M:%S",
    )
    quiet()  # third-party warnings (olmo_eval's, torch's) only with OLMO_VERBOSE=1
    try:
        cfg = load_config(config_path, overrides)
        return train(cfg)
    except DataError as e:  # bad input: one line (from the first rank), repeated in torchrun's failure summary
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        tell_launcher(f"error: {e}")  # every rank: an error only one rank met still reaches the user
        return 2
