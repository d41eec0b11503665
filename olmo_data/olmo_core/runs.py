"""An OLMo-core run as the data commands meet it: found from whatever config they were given, its length in steps,
its data's fingerprint, and the instances that hold a span of a token file (for `trace`).

`olmo_core_of(config)` is the one place that decides whether a command reads a run through this package: an
OLMo-core `config.json` (a path or its keys), or a config of ours whose `data.olmo_core` names one (a run our
trainer trained on OLMo-core's batches). Every other config gives None, and the command goes on with our rules.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig, olmo_core_form, read_run_config
from olmo_data.errors import DataError
from olmo_data.io import file_size
from olmo_data.olmo_core.batches import OlmoCoreData, TrainedAt
from olmo_data.olmo_core.config import read_olmo_core_config
from olmo_data.olmo_core.steps import PastEpochs, StepWalk


def olmo_core_of(config: Any, *, work_dir: str | None = None) -> OlmoCoreData | None:
    """OLMo-core's data side of `config` when it is (or, through data.olmo_core, trains on) an OLMo-core run;
    else None. `config` is what a command was given: a path, parsed keys or a TrainConfig. `work_dir` replaces
    the folder of OLMo-core's order files (a command's --order)."""
    raw = olmo_core_form(config)
    if raw is not None:
        data = OlmoCoreData(read_olmo_core_config(config if isinstance(config, str) else raw, work_dir=work_dir))
        data.raw = raw
        return data
    if isinstance(config, str) and not os.path.isfile(config):
        return None  # a save folder (spikes), or a file the command's own reader will name as missing
    if not isinstance(config, (str, dict, TrainConfig)):
        return None
    cfg = read_run_config(config)
    return open_trained_on(cfg, work_dir=work_dir) if cfg.data.olmo_core else None


def open_trained_on(cfg: TrainConfig, *, work_dir: str | None = None) -> OlmoCoreData:
    """The OLMo-core data a config of ours names in data.olmo_core, checked against the config's own model."""
    path = str(cfg.data.olmo_core)
    raw = olmo_core_form(path)
    if raw is None:
        raise DataError(
            f"config key 'data.olmo_core': {path} is not the config.json of an OLMo-core run (a JSON file whose "
            "dataset and data_loader sections name olmo_core classes); give the file an OLMo-core run saved"
        )
    data = OlmoCoreData(read_olmo_core_config(path, work_dir=work_dir))
    data.raw = raw
    if data.run.sequence_length != cfg.model.max_sequence_length:
        raise DataError(
            f"config key 'model.max_sequence_length': {cfg.model.max_sequence_length}, but the OLMo-core run "
            f"{path} cuts instances of {data.run.sequence_length} tokens; set model.max_sequence_length to "
            f"{data.run.sequence_length}"
        )
    return data


def data_fingerprint(data: OlmoCoreData) -> str:
    """A digest of what OLMo-core's instance numbers mean: the dataset's files (path, size, tokens used), their
    sources, label masks, the instance rule (kind, lengths, pad) and the order's seed. Another dataset, another
    digest; a run resumed on changed data is refused by it."""
    run, ds = data.run, data.dataset
    described = {
        "olmo_core": run.kind,
        "sequence_length": run.sequence_length,
        "max_target_sequence_length": run.max_target_sequence_length,
        "dtype": run.dtype,
        "pad": run.pad_token_id,
        "eos": run.eos_token_id,
        "seed": run.seed,
        "files": [[p, t, s] for p, t, s in zip(ds.paths, ds.file_tokens, ds.sources, strict=True)],
        "label_masks": list(run.label_mask_paths or []),
        "instances": len(ds),
    }
    if run.kind == "packed":  # how documents became instances (absent for the others: their digests unchanged)
        described |= {
            "long_doc_strategy": run.long_doc_strategy,
            "source_group_size": run.source_group_size,
            "bos": run.bos_token_id,
        }
    if run.interleaving is not None:  # how documents were chunked and mixed
        spec = run.interleaving
        described |= {
            "interleaving": [spec.docs_per_instance, spec.chunks_per_doc, spec.seed, spec.exempt_paths],
            "bos": run.bos_token_id,
        }
    if run.curriculum is not None:  # vsl: its buckets and the order of their batches
        described |= {"vsl": [run.min_sequence_length, run.curriculum.class_repr]}
    if data.composable is not None:  # its sources and its loader's order settings
        described |= {"composable": data.composable.describe()}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def run_length(data: OlmoCoreData) -> int | None:
    """The steps OLMo-core's Trainer trains: it stops once trainer.max_duration or trainer.hard_stop is due, whichever
    comes first (each in steps; tokens, stopping once the tokens seen reach it; epochs, every batch of epochs
    1..N); None when the config gives neither."""
    lengths = [
        _length(data, d, key)
        for d, key in ((data.run.max_duration, "max_duration"), (data.run.hard_stop, "hard_stop"))
        if d
    ]
    return min(lengths) if lengths else None


def _length(data: OlmoCoreData, duration: tuple[int, str], key: str) -> int:
    value, unit = duration
    if unit == "steps":
        return value
    walk = data.walk
    if unit == "tokens" and not walk.schedule:
        return -(-value // walk.global_batch_size)
    if unit == "epochs" and not walk.schedule:
        return value * walk.batches_per_epoch()
    try:
        return _last_step(walk, value, unit)
    except DataError as e:
        raise DataError(f"{e}: check trainer.{key} ({value:,} {unit})") from e


def _last_step(walk: StepWalk, value: int, unit: str) -> int:
    """The last step before a run of `value` `unit` (tokens or epochs) is done, with a batch-size schedule: found
    by bisection over the schedule's replay (which refuses to go past MAX_EPOCHS)."""

    def done(step: int) -> bool:  # the Trainer stops before drawing a batch once the duration is due
        try:
            slot = walk.slot(step)
        except PastEpochs:
            if unit == "epochs":  # past MAX_EPOCHS epochs, so past `value` (at most MAX_EPOCHS): done
                return True
            raise
        return slot.epoch > value if unit == "epochs" else slot.tokens_before >= value

    hi = 1
    while not done(hi):
        hi *= 2
    lo = hi // 2  # not done at lo (or lo == 0): the last step trained is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if done(mid) else (mid, hi)
    return lo


def instances_holding(data: OlmoCoreData, path: str, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(instance, first file token it holds, tokens held, position of that token in the instance) for every
    OLMo-core instance holding a token of tokens [start, end) of token file `path`: each occurrence of the file in
    the dataset (a mixture may repeat a file), each instance cut from it that overlaps the span; a packed instance
    once per document piece of the file it holds there, an interleaved one once per run of its tokens it holds in a
    row (each chunk of the document)."""
    ds, L = data.dataset, data.run.sequence_length
    out: list[tuple[int, int, int, int]] = []
    if ds.packed is not None:
        for instance, file_start, tokens, at in ds.packed.holding(path, start, end):
            out.append((instance, file_start, tokens, at))
        return out
    if ds.interleaved is not None:
        return ds.interleaved.holding(path, start, end)
    if ds.vsl is not None:  # a document's pieces, each one instance
        return ds.vsl.holding(path, start, end)
    if data.composable is not None:  # every instance's pieces, searched (olmo_core.composable.holding)
        return data.composable.holding(path, start, end)
    for k, p in enumerate(ds.paths):
        if p != path:
            continue
        first, count = int(ds.offsets[k]), int(ds.offsets[k + 1] - ds.offsets[k])
        if ds.documents is not None:
            spans = ds.documents[k]
            hit = np.flatnonzero((spans[:, 0] < end) & (spans[:, 1] > start))
            out += [(first + int(j), int(spans[j, 0]), int(spans[j, 1] - spans[j, 0]), 0) for j in hit]
        else:
            for j in range(start // L, min((end - 1) // L, count - 1) + 1):
                out.append((first + j, j * L, L, 0))
    return out


def trained_at(
    data: OlmoCoreData, instances: list[int], first: int, last: int, world_size: int
) -> dict[int, list[TrainedAt]]:
    """For each instance, every step in [first, last] whose batch held it: one pass over each epoch's order (a
    membership test), whatever the number of instances."""
    wanted = np.asarray(sorted(set(instances)), dtype=np.int64)
    out: dict[int, list[TrainedAt]] = {int(i): [] for i in wanted}
    if not len(wanted) or last < first:
        return out
    walk = data.walk
    for epoch in data.epochs_of(first, last):
        positions, entries = data.epoch_order(epoch).positions_of(wanted)
        for position, instance in zip(positions.tolist(), entries.tolist(), strict=True):
            for step in walk.steps_of(epoch, position, last):
                if step < first:
                    continue
                slot = walk.slot(step)
                within = position - slot.start
                rank = walk.rank_of(within, slot.instances, world_size)
                out[instance].append(TrainedAt(step, epoch, within, rank))
    return out


def token_file_tokens(data: OlmoCoreData, path: str) -> int:
    """Tokens in a token file of the run (for the document index's bounds check)."""
    return file_size(path) // data.dataset.itemsize
