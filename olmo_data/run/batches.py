"""Reconstruct any training batch: its instances, their tokens, and the documents they came from.

`inspect_batch(config, step=N)` answers "what did the model see at step N?" from the training config alone:
the data section and sequence length give the instance index, the seed and global batch size give the order
and the batch's slice of it, and the tokenize metadata (`part-*.csv.gz`, rows `start,end,id,src,loc`) gives
the documents each instance overlaps. The batch fingerprint is the one the trainer logs each step, so the two
can be compared.

Document lookups use the side index of `olmo_data.dataset.doc_index`, so inspecting a batch never scans a CSV, whatever
the dataset size.

When the run's save folder holds its per-instance loss record (`olmo_data.run.instance_loss`), each instance also
carries the loss the model had on it at that step (mean per supervised token) and its supervised token count.

When the config turns on `data.instance_filter`, each instance says whether OLMo's rule masks it (it stays in the
batch, the trainer trains none of its tokens) and which repetition caught it: the function is the trainer's own
(`olmo_data.dataset.instance_filter`), so the count matches the run's `train/masked_instances` for the step.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig
from olmo_data.dataset import DocIndex, DocumentSpan, InstanceSource, Repetition, dtype_note
from olmo_data.display import marked
from olmo_data.errors import DataError
from olmo_data.run.instance_loss import StepLosses, logged_batch_fingerprint, step_losses
from olmo_data.run.layout import INSTANCE_LOSS, save_folder_of
from olmo_data.run.lineage import format_lineage
from olmo_data.run.open import read_run
from olmo_data.run.reader import RunData, StepBatch

_ARRAYS_AND_RECORDS = ("documents", "token_ids", "label_mask", "repetition")  # converted one by one in to_json


@dataclass
class InstanceReport:
    position: int  # in the global batch
    instance: int  # index in the dataset (what the order holds)
    path: str
    token_offset: int
    token_ids: np.ndarray  # int64 (sequence_length,); lists only in to_json(), as converting costs time
    label_mask: np.ndarray | None = None  # bool, True = a training target
    source: str | None = None  # mixture source
    documents: list[DocumentSpan] | None = None  # None: the token file has no metadata
    text: str | None = None
    untrained_text: list[tuple[str, bool]] | None = None  # the text in runs of (piece, not a target): label masks
    masked: bool | None = None  # caught by data.instance_filter (no target trains); None: the filter is off
    repetition: Repetition | None = None  # of a masked instance, the repetition with the most copies
    loss: float | None = None  # the run's loss on it at this step, per supervised token; None: no record
    supervised_tokens: int | None = None  # its target tokens in that loss
    pieces: list[list[Any]] | None = None  # OLMo-core packed or interleaved: [path, start, end] of each run of tokens
    piece_positions: list[int] | None = None  # ... and where each sits in the instance
    doc_lens: list[int] | None = None  # OLMo-core packed with generate_doc_lengths: its doc_lens


@dataclass
class BatchReport:
    step: int
    global_batch: int
    epoch: int
    batch_in_epoch: int
    batches_per_epoch: int
    global_batch_size: int
    sequence_length: int
    seed: int
    num_instances: int
    order_path: str
    data_fingerprint: str
    batch_fingerprint: str
    rank: int | None
    world_size: int | None
    instances: list[InstanceReport] = field(default_factory=list)
    run_steps: int | None = None  # steps the config's max_duration trains; a later step was never trained
    instance_filter: dict[str, Any] | None = None  # data.instance_filter's settings when it is on
    masked_instances: int | None = None  # of the instances reported, those the filter masks; None: it is off
    lineage: list[dict[str, Any]] | None = None  # where the run grew from other stages: each stage (lineage.py)
    lineage_note: str | None = None  # the lineage as text, or why it could not be read
    loss_record: str | None = None  # the instance_loss.bin the losses come from; None: the run has none for the step
    assumed_dtype: str | None = None  # token files read as this dtype for want of a manifest or data.dtype
    trainer: str | None = None  # "olmo-core": the batch of an OLMo-core run (epochs 1-based, as it counts them)
    global_batch_tokens: int | None = None  # OLMo-core's global batch size, in tokens (its unit)
    order_note: str | None = None  # OLMo-core: where the epoch's order came from (its file, or rebuilt)
    note: str | None = None  # how the run's trainer counts (epochs from 1, batches in tokens), where it differs

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (built field by field: `asdict` would deep-copy millions of token ids)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "instances"}
        out["instances"] = [
            {f.name: getattr(i, f.name) for f in fields(i) if f.name not in (*_ARRAYS_AND_RECORDS, "untrained_text")}
            | {
                "token_ids": i.token_ids.tolist(),
                "label_mask": None if i.label_mask is None else i.label_mask.tolist(),
                "documents": None if i.documents is None else [asdict(d) for d in i.documents],
                "repetition": None if i.repetition is None else asdict(i.repetition),
            }
            for i in self.instances
        ]
        return out


def inspect_batch(
    config: str | dict[str, Any] | TrainConfig,
    *,
    step: int | None = None,
    batch_index: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    order: str | None = None,
    decode: bool = False,
    tokenizer: str | None = None,
    doc_index: DocIndex | None = None,
    source: InstanceSource | None = None,
    verify_data: bool = True,
    save_folder: str | None = None,
    positions: list[int] | None = None,
    run: RunData | None = None,
) -> BatchReport:
    """The global batch of training step `step` (1-based) or `batch_index` (0-based), or rank `rank`'s part.

    `config` is the training config (a path, its keys, or a TrainConfig: read as the trainer reads it).
    `order` overrides where the order is read (a directory, an epoch-0 order file or a URL). The batch fingerprint
    always covers the whole global batch, as the
    trainer's. `verify_data=False` uses an order whose recorded data fingerprint differs from the data's (the
    same files moved elsewhere, say); compare the batch fingerprint with the run's metrics to be sure.
    The per-instance losses are read from `save_folder` (default: the config's, or the folder of a run's own
    config.yaml). `positions` reports only those positions of the global batch. `run` is the run already read
    (`read_run`), for a caller asking about many steps.
    """
    if (step is None) == (batch_index is None):
        raise DataError("give exactly one of --step (1-based training step) and --batch-index (0-based)")
    if (rank is None) != (world_size is None):
        raise DataError("--rank and --world-size go together: rank r of world size W trains positions r, r+W, ...")
    if batch_index is not None and batch_index < 0:
        raise DataError(f"batch index must be >= 0, got {batch_index}")
    if run is None:
        run = read_run(config, order=order, source=source, verify_data=verify_data)
    decoder = run.decoder(tokenizer) if decode else None  # before any reading: a missing tokenizer said at once
    batch = run.batch(step if step is not None else run.step_of_batch_index(int(batch_index or 0)))
    gbs = len(batch.instances)
    if world_size is not None:
        run.check_world(batch.step, world_size)
    report = BatchReport(
        step=batch.step,
        global_batch=batch.global_batch,
        epoch=batch.epoch,
        batch_in_epoch=batch.batch_in_epoch,
        batches_per_epoch=batch.batches_per_epoch,
        global_batch_size=gbs,
        sequence_length=batch.row_length,
        seed=run.seed,
        num_instances=run.num_instances,
        order_path=batch.order_path,
        data_fingerprint=run.data_fingerprint(),
        batch_fingerprint=batch.fingerprint,
        rank=rank,
        world_size=world_size,
        run_steps=run.run_steps(),
        assumed_dtype=run.assumed_dtype,
        trainer=run.trainer,
        global_batch_tokens=batch.global_batch_tokens,
        order_note=batch.order_note,
        note=run.batch_note(batch),
    )
    chosen = _chosen(positions, rank, world_size, batch)
    losses = _losses(report, run.own, config, save_folder, gbs) if run.own is not None else None
    if isinstance(config, str):
        _add_lineage(report, run)
    placed = run.place(batch.instances[chosen])
    docs = doc_index or DocIndex()
    run.prepare_documents(placed, docs)
    rows = batch.tokens[chosen]
    filtered = run.instance_filter(batch.instances[chosen], rows, why=True)
    if filtered is not None:
        report.instance_filter, report.masked_instances = filtered.settings, int(filtered.masked.sum())
    masks = batch.label_mask
    for row, (p, where) in enumerate(zip(chosen.tolist(), placed, strict=True)):
        ids = batch.tokens[p]
        caught = filtered.repetitions[row] if filtered is not None and filtered.repetitions else []
        shown = ids[: where.length] if where.length < len(ids) else ids  # a padded instance: its own tokens
        report.instances.append(
            InstanceReport(
                position=p,
                instance=where.index,
                path=where.path,
                token_offset=where.start,
                token_ids=ids,
                label_mask=masks[p] if masks is not None else None,
                source=where.source,
                documents=run.documents(where, docs),
                pieces=[list(piece) for piece in where.pieces] or None,
                piece_positions=where.positions() or None,
                doc_lens=batch.doc_lens[p].tolist() if batch.doc_lens is not None else None,
                text=decoder.decode(shown.tolist()) if decoder is not None else None,
                untrained_text=_runs(decoder, ids, masks[p]) if decoder is not None and masks is not None else None,
                masked=bool(filtered.masked[row]) if filtered is not None else None,
                repetition=max(caught, key=lambda r: r.times) if caught else None,
                loss=_loss_of(losses.loss[p]) if losses is not None else None,
                supervised_tokens=int(losses.tokens[p]) if losses is not None else None,
            )
        )
    return report


def _runs(decoder: Any, ids: np.ndarray, mask: np.ndarray) -> list[tuple[str, bool]]:
    """The decoded text in runs of tokens that are (False) or are not (True) training targets."""
    untrained = ~np.asarray(mask, dtype=bool)
    cuts = [0, *(np.flatnonzero(untrained[1:] != untrained[:-1]) + 1).tolist(), len(ids)]
    runs = zip(cuts, cuts[1:], strict=False)
    return [(decoder.decode(ids[a:b].tolist()), bool(untrained[a])) for a, b in runs if b > a]


def _losses(report: BatchReport, cfg: TrainConfig, config: Any, save_folder: str | None, gbs: int) -> StepLosses | None:
    """The run's per-instance losses at the report's step, when its save folder holds them for this very batch
    (its logged fingerprint is the rebuilt one); sets `report.loss_record`."""
    folder = save_folder or save_folder_of(cfg, config if isinstance(config, str) else None)
    record = os.path.join(folder, INSTANCE_LOSS) if folder else None
    losses = step_losses(record, report.step) if record is not None else None
    if losses is not None and len(losses.tokens) != gbs:
        raise DataError(
            f"{record}: step {report.step} has {len(losses.tokens)} instances, but the config's global batch size "
            f"is {gbs}; is this the run of this config?"
        )
    if losses is not None and folder:
        logged = logged_batch_fingerprint(folder, report.step)
        if logged is not None and logged != report.batch_fingerprint:
            raise DataError(
                f"{record}: the run in {folder} trained another batch at step {report.step} (fingerprint {logged} "
                f"in its metrics, {report.batch_fingerprint} rebuilt from this config): its losses are not this "
                "batch's; give the config that run used, or --save-folder of this config's run"
            )
        if logged is None:  # no way to tell whose batch the losses belong to: none shown rather than maybe wrong
            losses = None
    report.loss_record = record if losses is not None else None
    return losses


def _chosen(positions: list[int] | None, rank: int | None, world_size: int | None, batch: StepBatch) -> np.ndarray:
    """The positions of the global batch a report shows: those asked for, a rank's, or all."""
    if positions is not None:
        return np.asarray(positions, dtype=np.int64)
    if rank is not None and world_size is not None:
        return batch.rank_positions(rank, world_size)
    return np.arange(len(batch.instances))


def _add_lineage(report: BatchReport, run: RunData) -> None:
    """The stages the run grew from, when it started from another run's checkpoint: a stage-2 step is inspected
    from the stage-2 config alone, and the report says which earlier runs also shaped the weights."""
    try:
        stages = run.lineage(report.run_steps)
    except DataError as e:
        report.lineage_note = f"lineage not read: {e}"
        return
    if len(stages) > 1:
        report.lineage = [s.to_json() for s in stages]
        report.lineage_note = format_lineage(stages)


def _loss_of(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def sort_instances(report: BatchReport, by: str) -> None:
    """Order the report's instances by `position` (the batch's order) or `loss` (highest first; instances without
    a loss last). Sorting by loss needs the run's per-instance loss record for the step."""
    if by == "position":
        report.instances.sort(key=lambda i: i.position)
    elif by == "loss":
        if report.loss_record is None:
            raise DataError(
                f"--sort loss: no per-instance losses for step {report.step} (the save folder has no "
                f"{INSTANCE_LOSS} with that step: the run did not train it yet, or predates the record)"
            )
        report.instances.sort(key=lambda i: (i.loss is None, -(i.loss or 0.0), i.position))
    else:
        raise DataError(f"--sort {by!r}: expected position or loss")


def format_report(report: BatchReport, *, max_tokens: int = 16) -> str:
    """The human-readable form `olmo-data inspect-batch` prints."""
    r = report
    lines = [
        f"step {r.step} = global batch {r.global_batch} (epoch {r.epoch}, batch {r.batch_in_epoch} of "
        f"{r.batches_per_epoch} per epoch); global batch size {r.global_batch_size}, sequence length "
        f"{r.sequence_length}, seed {r.seed}, {r.num_instances:,} instances",
        f"order: {r.order_path}" if r.order_note is None else f"order: {r.order_note}",
        f"data fingerprint: {r.data_fingerprint}",
        f"batch fingerprint: {r.batch_fingerprint}",
    ]
    if r.note:
        lines.insert(1, str(r.note))
    if r.assumed_dtype is not None:
        lines.append(dtype_note(r.assumed_dtype))
    if r.run_steps is not None and r.step > r.run_steps:
        lines.append(
            f"note: the run trains {r.run_steps} steps (its max_duration), so it never trained step {r.step}: this is "
            "the batch the order holds for that step, had the run gone on"
        )
    if r.lineage_note is not None:
        lines.append("this run grew from other stages (steps counted per run; `olmo-data trace` follows them):")
        lines += ["  " + line for line in r.lineage_note.splitlines()]
    if r.instance_filter is not None:
        f = r.instance_filter
        lines.append(
            f"instance filter: a sequence of {f['repetition_min_period']}..{f['repetition_max_period']} tokens "
            f"repeated {f['repetition_max_count']} times or more masks the instance; {r.masked_instances} of "
            f"{len(r.instances)} instances shown are masked (kept in the batch, no token trained)"
        )
    if r.rank is not None:
        lines.append(
            f"rank {r.rank} of world size {r.world_size}: positions {r.rank}, {r.rank}+{r.world_size}, ... "
            f"({len(r.instances)} instances)"
        )
    for inst in r.instances:
        src = f" (source {inst.source})" if inst.source else ""
        mark = " MASKED (instance filter)" if inst.masked else ""
        lines.append(f"[{inst.position}] instance {inst.instance}: {inst.path} @ token {inst.token_offset}{src}{mark}")
        if inst.pieces:
            lines.append(
                f"    pieces: {len(inst.pieces)} runs of file tokens: "
                + ", ".join(
                    f"{path} [{a}, {b}) at {at}"
                    for (path, a, b), at in zip(inst.pieces, inst.piece_positions or [], strict=True)
                )
                + (f"; doc_lens {inst.doc_lens}" if inst.doc_lens is not None else "")
            )
        if inst.supervised_tokens is not None:
            value = "-" if inst.loss is None else f"{inst.loss:.4f}"
            lines.append(f"    loss: {value} over {inst.supervised_tokens} supervised tokens (at this step)")
        if inst.repetition is not None:
            rep = inst.repetition
            lines.append(
                f"    masked: tokens [{rep.start}, {rep.end}) are a {rep.period}-token sequence repeated {rep.times} "
                f"times: {' '.join(map(str, inst.token_ids[rep.start : rep.start + rep.period].tolist()))}"
            )
        shown = " ".join(map(str, inst.token_ids[:max_tokens].tolist()))
        more = f" ... ({len(inst.token_ids)} tokens)" if len(inst.token_ids) > max_tokens else ""
        lines.append(f"    tokens: {shown}{more}")
        if inst.label_mask is not None:
            lines.append(f"    label mask: {int(inst.label_mask.sum())} of {len(inst.label_mask)} tokens are targets")
        if inst.documents is None:
            lines.append("    documents: (no metadata beside the token file)")
        for d in inst.documents or []:
            lines.append(
                f"    doc {d.id!r} from {d.src} line {d.loc}: instance tokens [{d.instance_start}, "
                f"{d.instance_end}) = document tokens [{d.document_start}, "
                f"{d.document_start + d.instance_end - d.instance_start}) of {d.end - d.start}"
            )
        if inst.text is not None:
            shown_text = inst.text if inst.untrained_text is None else marked(inst.untrained_text)
            legend = " ([[ ]]: not trained, the label mask's)" if inst.untrained_text is not None else ""
            lines.append(f"    text{legend}:")
            lines += ["      " + line for line in shown_text.splitlines() or [""]]
    return "\n".join(lines)
