"""Dataset statistics: what a training run will actually see, before it runs.

Token counts in a directory are not what training consumes: each file loses its leftover tokens when cut into
instances, a mix selects or repeats instances, and the batch size drops the tail of every epoch. These numbers
are computed here from the same instance index the trainer uses, so "how many epochs will 10k steps take" has
one answer everywhere. Document lengths come from the tokenize metadata via the document side index.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from olmo_data.config import duration_steps, read_run_config
from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.instances import InstanceSource, dtype_note, open_dataset, open_from_config
from olmo_data.dataset.mixture import read_mix_manifest
from olmo_data.dataset.order import batches_per_epoch
from olmo_data.display import progress_bar
from olmo_data.errors import DataError

PERCENTILES = (0, 10, 50, 90, 99, 100)


@dataclass
class FileStats:
    path: str
    source: str
    tokens: int
    instances: int
    dropped_tokens: int  # leftovers at the end of the file that no instance holds
    documents: int | None  # None: no metadata beside the file


@dataclass
class SourceStats:
    name: str
    files: int
    tokens: int  # in the files
    documents: int | None
    available_instances: int  # cut from the files
    instances: int  # in the dataset (after a mix's selection)
    share: float  # of the dataset's instances


@dataclass
class DatasetStats:
    sequence_length: int
    num_instances: int
    instance_tokens: int
    file_tokens: int
    documents: int | None
    files: list[FileStats]
    sources: list[SourceStats]
    document_lengths: dict[str, float] = field(default_factory=dict)  # percentiles, mean
    length_histogram: list[tuple[int, int, int]] = field(default_factory=list)  # [lo, hi) tokens, documents
    global_batch_size: int | None = None
    batches_per_epoch: int | None = None
    dropped_per_epoch: int | None = None
    duration: str | None = None
    steps: int | None = None
    epochs: float | None = None
    assumed_dtype: str | None = None  # token files read as this dtype for want of a manifest or data.dtype

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _source_name(source: InstanceSource, file_index: int) -> str:
    name = source.source_of_file(file_index)
    return name if name is not None else os.path.dirname(source.files[file_index].path) or "."


def dataset_stats(
    source: InstanceSource,
    *,
    global_batch_size: int | None = None,
    duration: int | str | None = None,
    document_lengths: bool = True,
    cache_dir: str | None = None,
    progress: bool | None = None,
) -> DatasetStats:
    """Tokens, documents and instances per file and source; document lengths; epochs for a batch size and
    a duration (OLMo's max_duration: steps, tokens or epochs). The bar follows the files' tokens: reading each
    file's document metadata is what takes time on large data."""
    L = source.sequence_length
    docs = DocIndex(cache_dir) if document_lengths else None
    if docs is not None:  # every file's metadata and index probed at once, not one round trip after another
        docs.prepare([(f.path, f.metadata_path) for f in source.files])
    files: list[FileStats] = []
    lengths: list[tuple[np.ndarray, np.ndarray]] = []
    bar = progress_bar(desc="stats", total=sum(f.num_tokens for f in source.files), unit=" tokens", progress=progress)
    for k, f in enumerate(source.files):
        n = f.num_tokens // L
        index = docs.index_for(f.path, f.metadata_path, f.num_tokens) if docs is not None else None
        if index is not None:  # (an index file's lengths section: a few KB, where the rows are 36 B a document)
            lengths.append(index.length_counts())
        files.append(
            FileStats(
                f.path,
                _source_name(source, k),
                f.num_tokens,
                n,
                f.num_tokens - n * L,
                index.documents if index is not None else None,
            )
        )
        bar.update(f.num_tokens)
    bar.close()
    names = list(dict.fromkeys(fs.source for fs in files))
    total = len(source)
    sources = []
    for name in names:
        mine = [fs for fs in files if fs.source == name]
        available = sum(fs.instances for fs in mine)
        used = source.source_instances(name) if source.mix is not None else available
        doc_counts = [fs.documents for fs in mine]
        sources.append(
            SourceStats(
                name,
                len(mine),
                sum(fs.tokens for fs in mine),
                None if any(d is None for d in doc_counts) else sum(d or 0 for d in doc_counts),
                available,
                used,
                used / total if total else 0.0,
            )
        )
    doc_total = None if any(fs.documents is None for fs in files) else sum(fs.documents or 0 for fs in files)
    out = DatasetStats(L, total, total * L, sum(f.num_tokens for f in source.files), doc_total, files, sources)
    out.assumed_dtype = source.assumed_dtype
    if lengths:
        values, inverse = np.unique(np.concatenate([v for v, _ in lengths]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([c for _, c in lengths])).astype(np.int64)
        if counts.sum():
            out.document_lengths, out.length_histogram = length_summary(values, counts)
    if global_batch_size is not None:
        per_epoch = batches_per_epoch(total, global_batch_size)
        out.global_batch_size = global_batch_size
        out.batches_per_epoch = per_epoch
        out.dropped_per_epoch = total - per_epoch * global_batch_size
        if duration is not None:
            steps = duration_steps(
                duration, global_batch_size=global_batch_size, sequence_length=L, batches_per_epoch=per_epoch
            )
            out.duration = str(duration)
            out.steps = steps
            out.epochs = steps / per_epoch if per_epoch else math.inf
    return out


def length_summary(values: np.ndarray, counts: np.ndarray) -> tuple[dict[str, float], list[tuple[int, int, int]]]:
    """Percentiles, mean and power-of-two histogram of document lengths given as (distinct values ascending, how
    many documents have each): exactly what numpy gives on the lengths written out one per document (its linear
    percentiles, float64 mean), without writing them out (2.4e9 documents at OLMo 3's scale)."""
    n = int(counts.sum())
    ends = np.cumsum(counts)

    def at(k: np.ndarray) -> np.ndarray:  # the k-th smallest length
        return values[np.searchsorted(ends, k, side="right")].astype(np.float64)

    virtual = np.asarray(PERCENTILES, np.float64) / 100 * (n - 1)
    below = np.floor(virtual)
    gamma = virtual - below
    a, b = at(below.astype(np.int64)), at(np.minimum(below.astype(np.int64) + 1, n - 1))
    pct = np.where(gamma >= 0.5, b - (b - a) * (1 - gamma), a + (b - a) * gamma)  # (numpy's lerp, both halves)
    summary = {f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}
    summary["mean"] = float(np.float64(int((values.astype(np.int64) * counts).sum())) / n)
    top = max(1, int(values[-1]))
    edges = [0] + [2**i for i in range(int(math.log2(top)) + 2)]
    binned, _ = np.histogram(values, bins=edges, weights=counts)
    return summary, [(edges[i], edges[i + 1], int(c)) for i, c in enumerate(binned) if c]


def stats_for(
    paths: Sequence[str],
    *,
    mix: str | None = None,
    sequence_length: int | None = None,
    global_batch_size: int | None = None,
    duration: int | str | None = None,
    dtype: str | None = None,
    document_lengths: bool = True,
    progress: bool | None = None,
) -> DatasetStats:
    """`dataset_stats` of token files/directories `paths`, of a `mix`, or of the data of a training config (a
    `.yaml` path, alone in `paths`), as `olmo-data stats` takes them.

    A config gives the data, sequence length, batch size and duration, and the arguments override them; a mix
    gives its sequence length (it was cut at it). Without either, `sequence_length` is required.
    """
    configs = [p for p in paths if p.endswith((".yaml", ".yml"))]
    if configs and len(paths) > 1:
        raise DataError(f"give one training CONFIG or token files/directories, not both: {' '.join(paths)}")
    config = configs[0] if configs else None
    if config is not None:
        cfg = read_run_config(config)
        if sequence_length is not None:
            cfg.model.max_sequence_length = sequence_length
        source = open_from_config(cfg)
        global_batch_size = global_batch_size or cfg.global_train_batch_size
        duration = duration or cfg.max_duration
    else:
        if sequence_length is None and mix is not None and not paths:
            sequence_length = int(read_mix_manifest(mix)[0]["sequence_length"])  # the mix was cut at it
        if sequence_length is None:
            raise DataError("--sequence-length is required without a CONFIG (instances are cut at that length)")
        if bool(paths) == bool(mix):
            raise DataError("give token files/directories as PATHS, or --mix DIR, or a training CONFIG")
        source = open_dataset(list(paths) or None, sequence_length=sequence_length, mix=mix, dtype=dtype)
    return dataset_stats(
        source,
        global_batch_size=global_batch_size,
        duration=duration,
        document_lengths=document_lengths,
        progress=progress,
    )


def format_stats(stats: DatasetStats) -> str:
    """The text `olmo-data stats` prints."""
    s = stats
    docs = f"{s.documents:,} documents, " if s.documents is not None else ""
    lines = [
        f"{docs}{s.file_tokens:,} tokens in {len(s.files)} files; {s.num_instances:,} instances of "
        f"{s.sequence_length} tokens = {s.instance_tokens:,} tokens",
    ]
    if s.assumed_dtype is not None:
        lines.append(dtype_note(s.assumed_dtype))
    lines += ["", "per source:"]
    for src in s.sources:
        d = f"{src.documents:,} docs, " if src.documents is not None else ""
        lines.append(
            f"  {src.name}: {src.files} files, {d}{src.tokens:,} tokens, {src.available_instances:,} "
            f"instances available, {src.instances:,} used ({src.share:.1%} of the dataset)"
        )
    lines.append("per file:")
    for f in s.files:
        d = f"{f.documents:,} docs, " if f.documents is not None else ""
        lines.append(
            f"  {f.path}: {d}{f.tokens:,} tokens, {f.instances:,} instances, {f.dropped_tokens:,} "
            "tokens dropped at the end"
        )
    if s.document_lengths:
        dl = s.document_lengths
        lines.append("document length (tokens): " + ", ".join(f"{k} {v:,.0f}" for k, v in dl.items()))
        width = max(c for _, _, c in s.length_histogram)
        for lo, hi, c in s.length_histogram:
            lines.append(f"  [{lo:>9,}, {hi:>9,}) {c:>8,} " + "#" * max(1, round(40 * c / width)))
    if s.global_batch_size is not None:
        lines.append(
            f"global batch size {s.global_batch_size}: {s.batches_per_epoch:,} steps per epoch, "
            f"{s.dropped_per_epoch:,} instances dropped per epoch"
        )
    if s.steps is not None:
        lines.append(
            f"duration {s.duration}: {s.steps:,} steps = {s.epochs:.3f} epochs "
            f"({s.steps * (s.global_batch_size or 0) * s.sequence_length:,} tokens)"
        )
    return "\n".join(lines)
