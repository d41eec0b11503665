"""`stats` and `build-order` of an OLMo-core run: its data as OLMo-core's loader sees it, and its order files.

`olmo_core_stats` gives the numbers `olmo-data stats` prints for our runs (`olmo_data.dataset.DatasetStats`:
tokens, documents and instances per file and source, steps per epoch, the run's length), counted by OLMo-core's
rules: each occurrence of a file in a mixture with its token budget, a padded dataset's one instance per
document, whole chunks with `max_target_sequence_length`; the batch size in tokens and in instances, epochs
numbered from 1, and each epoch's order file as found in the work_dir or not.

`build_olmo_core_orders` writes epochs' orders under OLMo-core's own names and bytes into its loader's work_dir
(or a destination), so an OLMo-core loader pointed there uses them as its own; a file already there is checked
byte for byte and kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from olmo_data.dataset import DatasetStats, DocIndex, FileStats, SourceStats, first_difference
from olmo_data.errors import DataError
from olmo_data.io import file_size
from olmo_data.olmo_core.batches import OlmoCoreData
from olmo_data.olmo_core.config import MAX_EPOCHS
from olmo_data.olmo_core.interleaved import write_interleaving
from olmo_data.olmo_core.order import (
    build_olmo_core_order,
    olmo_core_order,
    order_file_name,
    write_olmo_core_order,
)
from olmo_data.olmo_core.packed import write_packing
from olmo_data.olmo_core.runs import run_length
from olmo_data.olmo_core.vsl_loader import VSLWalk, vsl_stats, write_vsl_files


@dataclass
class OlmoCoreStats:
    """`stats` of an OLMo-core run: our statistics' fields, and OLMo-core's own terms beside them."""

    stats: DatasetStats
    global_batch_tokens: int
    orders: list[str]  # per epoch of the run (at most the first few): the order file found, or where it would be
    dataset_files: list[str] = field(default_factory=list)  # its dataset's own files (interleaved): found or rebuilt
    buckets: list[dict[str, int]] | None = None  # vsl: per bucket, its length, instances and batches an epoch
    vsl_files: list[str] | None = None  # vsl: its dataset's files, read or rebuilt

    def to_json(self) -> dict[str, Any]:
        return self.stats.to_json() | {
            "trainer": "olmo-core",
            "global_batch_tokens": self.global_batch_tokens,
            "orders": self.orders,
            **({"buckets": self.buckets, "vsl_files": self.vsl_files} if self.buckets is not None else {}),
            **({"dataset_files": self.dataset_files} if self.dataset_files else {}),
        }


def olmo_core_stats(data: OlmoCoreData, *, doc_index: DocIndex | None = None, max_orders: int = 4) -> OlmoCoreStats:
    """What OLMo-core's loader reads of the run's data (see the module)."""
    ds, run = data.dataset, data.run
    docs = doc_index or DocIndex()
    L = run.sequence_length
    files: list[FileStats] = []
    by_source: dict[str, list[int]] = {}
    docs.prepare([(p, None) for p in dict.fromkeys(ds.paths)])  # every file's metadata probed at once, not in turn
    packed_held = ds.packed.held_per_file() if ds.packed is not None else None
    if ds.vsl is not None:  # the tokens of its pieces (the rest: shorter than its shortest bucket, or no document)
        packed_held = ds.vsl.held_per_file()
    if ds.interleaved is not None:  # the tokens its instances read (see InterleavedInstances.held_per_file)
        packed_held = ds.interleaved.held_per_file()
    if data.composable is not None:  # the tokens its instances' pieces read, each once (composable.holding)
        packed_held = data.composable.held_per_file()
    for k, path in enumerate(ds.paths):
        tokens = file_size(path) // ds.itemsize
        used = ds.file_tokens[k]
        instances = int(ds.offsets[k + 1] - ds.offsets[k])
        index = docs.index_for(path)
        name = ds.sources[k] if ds.sources[k] is not None else os.path.dirname(path) or "."
        if packed_held is not None:  # packed: the tokens of its documents (instances counted by their first one)
            held = packed_held[k]
        elif ds.documents is None:
            held = instances * L
        else:
            held = int((ds.documents[k][:, 1] - ds.documents[k][:, 0]).sum())
        files.append(
            FileStats(
                path=path,
                source=str(name),
                tokens=tokens,
                instances=instances,
                dropped_tokens=max(0, min(used, tokens) - held) if ds.documents is None else 0,
                documents=index.documents if index is not None else None,  # (an index file's head: no rows read)
            )
        )
        by_source.setdefault(str(name), []).append(k)
    n = len(ds)
    sources = [
        SourceStats(
            name=name,
            files=len(ks),
            tokens=sum(files[k].tokens for k in ks),
            documents=None if any(files[k].documents is None for k in ks) else sum(files[k].documents or 0 for k in ks),
            available_instances=sum(files[k].instances for k in ks),
            instances=sum(files[k].instances for k in ks),
            share=sum(files[k].instances for k in ks) / n if n else 0.0,
        )
        for name, ks in by_source.items()
    ]
    per_batch = data.slot(1).instances
    per_epoch = data.walk.batches_per_epoch(per_batch * L)
    steps = run_length(data)
    duration = run.max_duration
    documents = [f.documents for f in files]
    stats = DatasetStats(
        sequence_length=L,
        num_instances=n,
        instance_tokens=n * L,
        file_tokens=sum(f.tokens for f in files),
        documents=None if any(d is None for d in documents) else sum(d or 0 for d in documents),
        files=files,
        sources=sources,
        global_batch_size=per_batch,
        batches_per_epoch=per_epoch,
        dropped_per_epoch=n - per_epoch * per_batch,
        duration=", ".join(f"{name}{d[0]} {d[1]}" for name, d in (("", duration), ("hard_stop ", run.hard_stop)) if d)
        or None,
        steps=steps,
        epochs=(data.slot(steps).epoch - 1 + (data.slot(steps).batch + 1) / per_epoch) if steps and per_epoch else None,
    )
    buckets = vsl_stats(stats, data.walk) if isinstance(data.walk, VSLWalk) else None
    per_batch = stats.global_batch_size or per_batch
    last_epoch = data.slot(steps).epoch if steps else 1
    orders = [data.order_note(e) for e in range(1, min(last_epoch, max_orders) + 1)]
    mixed = [f"interleaving: {ds.interleaved.note}"] if ds.interleaved is not None else []
    vsl_notes = ds.vsl.notes if ds.vsl is not None else None
    return OlmoCoreStats(stats, per_batch * L, orders, mixed, buckets=buckets, vsl_files=vsl_notes)


def format_olmo_core_stats(result: OlmoCoreStats, formatted: str) -> str:
    """`formatted` (our stats' text) with OLMo-core's terms after it."""
    s = result.stats
    lines = [
        formatted,
        f"an OLMo-core run: global batch {result.global_batch_tokens:,} tokens ({s.global_batch_size} instances "
        f"of {s.sequence_length}); epochs counted from 1, as OLMo-core counts them",
    ]
    lines += [f"epoch {e} order: {note}" for e, note in enumerate(result.orders, start=1)]
    for b in result.buckets or []:  # vsl: a batch is one bucket's instances
        lines.append(
            f"bucket {b['length']:,}: {b['instances']:,} instances, {b['batches_per_epoch']:,} batches an epoch of "
            f"{b['instances_per_batch']:,} instances"
        )
    lines += result.vsl_files or []
    lines += result.dataset_files
    return "\n".join(lines)


def build_olmo_core_orders(
    data: OlmoCoreData, *, epochs: int = 1, first_epoch: int = 1, destination: str | None = None
) -> list[str]:
    """Write epochs first_epoch .. first_epoch + epochs - 1 (1-based, OLMo-core's) under OLMo-core's names into
    `destination` (default: its loader's work_dir); one line per epoch says what was done."""
    if first_epoch < 1:
        raise DataError(f"--first-epoch {first_epoch}: OLMo-core counts epochs from 1")
    if not 1 <= epochs <= MAX_EPOCHS:
        raise DataError(f"--epochs {epochs}: expected 1 to {MAX_EPOCHS:,}")
    run, n = data.run, len(data.dataset)
    folder = destination or run.work_dir
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise DataError(f"{folder}: not a directory; OLMo-core's order files go into a work_dir (--destination DIR)")
    if data.composable is not None:  # its loader's order files (OLMo-core rebuilds its sources' own caches)
        return data.composable.write_orders(range(first_epoch, first_epoch + epochs), folder)
    if isinstance(data.walk, VSLWalk):  # its dataset's and its loader's own files (vsl_loader)
        return write_vsl_files(data.walk, range(first_epoch, first_epoch + epochs), destination)
    lines = []
    for epoch in range(first_epoch, first_epoch + epochs):
        path = os.path.join(folder, order_file_name(n, epoch, run.seed, run.chunk_size))
        if os.path.lexists(path):  # checked as every command checks it (a directory, its size, a sample), then whole
            found = olmo_core_order(folder, n, run.seed, epoch, run.chunk_size)
            want = build_olmo_core_order(n, run.seed, epoch, run.chunk_size)
            _check_identical(path, found.order, want, epoch, run.seed, n)
            lines.append(f"epoch {epoch}: {path} is there, identical to OLMo-core's order (kept)")
            continue
        write_olmo_core_order(folder, n, run.seed, epoch, run.chunk_size)
        lines.append(
            f"epoch {epoch}: wrote {path} ({n // run.chunk_size * run.chunk_size:,} instances): OLMo-core's name "
            "and bytes, read as its own by its loader with this work_dir"
        )
    if data.dataset.packed is not None:  # its dataset's packing files: in the dataset's work_dir, or beside these
        lines += write_packing(run, data.dataset.packed, destination or run.dataset_work_dir, data.dataset.itemsize)
    if data.dataset.interleaved is not None:  # its documents and interleaving, likewise
        lines += write_interleaving(data.dataset.interleaved, destination or run.dataset_work_dir)
    return lines


def _check_identical(path: str, stored: np.ndarray, want: np.ndarray, epoch: int, seed: int, n: int) -> None:
    """An order file already there (its size checked) is the order OLMo-core builds, byte for byte."""
    at = first_difference(stored, want)
    if at is not None:
        raise DataError(
            f"{path}: not the order OLMo-core builds for epoch {epoch} (seed {seed}, {n} instances): entry "
            f"{at:,} is {int(stored[at]):,}, OLMo-core's is {int(want[at]):,}; remove it, or check the run's "
            "dataset and seed"
        )
