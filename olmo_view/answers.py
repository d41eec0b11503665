"""What the view shows, asked of the data library: the one module of `olmo_view` that imports `olmo_data`.

A `RunAnswers` opens the run once (its config, its data's instance index, the document index, the tokenizer, the
metrics) and keeps them while the server lives, so each page costs only its own question. Every answer is the
library's own (`find_spikes`, `inspect_batch`, `trace_spans`, `trace_chain`, `lineage_of_config`, `dataset_stats`),
so what a page shows is what the command of the same name prints. Nothing here writes (`write_atomically`,
the library's atomic file, is passed on for `plot`'s PNGs).
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from olmo_data.config import read_run_config
from olmo_data.dataset import DatasetStats, DocIndex, DocumentSpan, Sources, dataset_stats, open_from_config
from olmo_data.errors import DataError
from olmo_data.io import atomic_path as write_atomically
from olmo_data.run import (
    METRICS,
    BatchReport,
    InstanceReport,
    Spike,
    SpikeReport,
    Stage,
    find_spikes,
    inspect_batch,
    lineage_of_config,
    run_files,
)
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace import MIN_TOKENS, ChainTrace, SpansReport, trace_chain, trace_spans

__all__ = [
    "DOCUMENT_TOKENS",
    "MIN_TOKENS",
    "BatchReport",
    "Busy",
    "ChainTrace",
    "DataError",
    "DatasetStats",
    "DocumentSpan",
    "InstanceReport",
    "Piece",
    "RunAnswers",
    "SpansReport",
    "Spike",
    "SpikeReport",
    "Stage",
    "StepView",
    "read_metrics",
    "write_atomically",
]

SPIKE_TOP = 5  # instances named per spike: `olmo-data spikes`'s default, so the two list the same ones
DOCUMENT_TOKENS = 4096  # a document's text shown up to this many tokens
T = TypeVar("T")


@dataclass
class Piece:
    """A run of an instance's tokens decoded to text: inside one document, trained on (a target) or not."""

    text: str
    supervised: bool
    document: int | None  # index into the instance's documents; None: tokens no metadata row covers


@dataclass
class StepView:
    """A step's batch as `inspect-batch` rebuilds it, and what the run logged for that step."""

    report: BatchReport
    logged_fingerprint: str | None  # train/batch_fingerprint in metrics.jsonl; None: not logged
    spike: Spike | None  # the step is one of the run's spikes
    excess: dict[int, float] = field(default_factory=dict)  # position -> share of the loss above the baseline


def read_metrics(path: str) -> dict[int, dict[str, Any]]:
    """The records of a metrics.jsonl by step (a resumed run's later record of a step replaces the earlier one; a
    line cut short by a kill, and a record of no step, are skipped)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: not found; the run has logged no steps yet (or this is not its save folder)")
    out: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and type(record.get("step")) is int:
                out[record["step"]] = record
    return out


class Busy(Exception):
    """Every slot for a costly answer (a trace, a document's steps) is taken: asked again later, not queued, so a
    page elsewhere that asks for traces in a loop never holds the threads the Run page is answered by."""

    def __init__(self, retry_after: int = 5) -> None:
        super().__init__("the view is computing as many traces as it computes at once; retry in a few seconds")
        self.retry_after = retry_after


class RunAnswers:
    """One run's answers, its data opened once and kept warm, shared by the server's threads.

    Safe from several threads at once: what is kept is guarded by a lock that is never held while an answer is
    computed (a 10 s trace must not hold up the Run page), a value kept for the server's life is computed once
    (the others asking wait for it), and at most `costly` traces or document lookups compute at once (`Busy`
    past that). What the answers share underneath is safe to share: the instance index is read-only after it is
    opened (memory maps and `pread`), the document index locks its own building, the tokenizer only decodes, and
    `trace_spans`/`trace_chain` open what they search per call."""

    def __init__(self, run: str, *, window: int = 20, z: float = 3.0, costly: int = 2) -> None:
        self.run = run
        self.config, self.folder = run_files(run)
        self.cfg = read_run_config(self.config)
        self.source = open_from_config(self.cfg)
        self.sources = Sources(self.source, self.cfg.data.paths)
        self.docs = DocIndex()
        self.window, self.z = window, z
        self.metrics_path = os.path.join(self.folder, METRICS)
        self.metrics = read_metrics(self.metrics_path)
        self._metrics_seen = _stamp(self.metrics_path)
        self.global_batch_size = self.cfg.global_train_batch_size
        self._lock = threading.Lock()  # guards the kept values below; never held while computing one
        self._follow_lock = threading.Lock()  # one thread re-reads a grown metrics.jsonl
        self._generation = 0  # bumped when the metrics change: a value computed before is not kept
        self._once: dict[str, Any] = {}
        self._making: dict[str, threading.Lock] = {}  # per key kept for the server's life: its one maker
        self._recent: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._costly = threading.BoundedSemaphore(max(1, costly))

    @property
    def name(self) -> str:
        return self.cfg.run_name or os.path.basename(os.path.abspath(self.folder))

    # -- kept for the server's life ---------------------------------------------------------------------------

    def _cached(self, key: str, make: Callable[[], T]) -> T:
        self._follow()
        with self._lock:
            if key in self._once:
                return self._once[key]  # type: ignore[no-any-return]
            maker = self._making.setdefault(key, threading.Lock())
        with maker:  # one thread computes it; the others asking meanwhile wait for that answer
            with self._lock:
                if key in self._once:
                    return self._once[key]  # type: ignore[no-any-return]
                generation = self._generation
            value = make()
            with self._lock:
                if generation == self._generation:
                    self._once[key] = value
            return value

    def _recently(self, key: tuple[Any, ...], make: Callable[[], T], keep: int = 16, costly: bool = False) -> T:
        """The answer to a question asked lately (a step paged through, a text traced again), else a new one
        (`costly`: one of the answers of which only so many compute at once, else `Busy`)."""
        self._follow()
        with self._lock:
            if key in self._recent:
                self._recent.move_to_end(key)
                return self._recent[key]  # type: ignore[no-any-return]
            generation = self._generation
        if costly and not self._costly.acquire(blocking=False):
            raise Busy()
        try:
            value = make()
        finally:
            if costly:
                self._costly.release()
        with self._lock:
            if generation == self._generation:
                self._recent[key] = value
                while len(self._recent) > keep:
                    self._recent.popitem(last=False)
        return value

    def _follow(self) -> None:
        """A run still training appends to metrics.jsonl (and its loss record): when the file changed, the curves,
        spikes and steps are asked again, so a reload of a page shows the steps logged since."""
        if _stamp(self.metrics_path) == self._metrics_seen:
            return
        with self._follow_lock:
            stamp = _stamp(self.metrics_path)
            if stamp == self._metrics_seen:
                return  # another thread read it meanwhile
            metrics = read_metrics(self.metrics_path)
            with self._lock:
                self.metrics = metrics
                self._metrics_seen = stamp
                self._generation += 1
                for key in ("curves", "spikes"):
                    self._once.pop(key, None)
                self._recent.clear()

    def warm(self) -> None:
        """Answer the questions every visit asks (spikes, stages, data statistics) ahead of the first page."""
        for answer in (self.spikes, self.stages, self.stats):
            try:
                answer()
            except DataError:
                pass  # the page that needs it says why

    def tokenizer(self) -> Any:
        return self._cached("tokenizer", lambda: data_tokenizer(None, self.source))

    def spikes(self) -> SpikeReport:
        """`olmo-data spikes RUN` with this view's window and z, the same instances named per spike."""
        return self._cached("spikes", lambda: find_spikes(self.run, window=self.window, z=self.z, top=SPIKE_TOP))

    def stages(self) -> list[Stage]:
        """`olmo-data lineage CONFIG`."""
        return self._cached("stages", lambda: lineage_of_config(self.config))

    def stats(self) -> DatasetStats:
        """`olmo-data stats CONFIG`: sources, shares, document lengths."""
        return self._cached(
            "stats",
            lambda: dataset_stats(
                self.source, global_batch_size=self.global_batch_size, duration=self.cfg.max_duration
            ),
        )

    # -- the run's curves -------------------------------------------------------------------------------------

    def curves(self) -> dict[str, tuple[list[int], list[float]]]:
        """Each logged series over steps: train/loss, train/z_loss, optim/lr, and train/source/LABEL/loss."""

        def series() -> dict[str, tuple[list[int], list[float]]]:
            out: dict[str, tuple[list[int], list[float]]] = {}
            for step in sorted(self.metrics):
                for key, value in self.metrics[step].items():
                    wanted = key in ("train/loss", "train/z_loss", "optim/lr") or (
                        key.startswith("train/source/") and key.endswith("/loss")
                    )
                    if wanted and isinstance(value, (int, float)) and not isinstance(value, bool):
                        steps, values = out.setdefault(key, ([], []))
                        steps.append(step)
                        values.append(float(value))
            return out

        return self._cached("curves", series)

    # -- a step -----------------------------------------------------------------------------------------------

    def step(self, step: int) -> StepView:
        """The batch of `step` with the run's loss on each instance (`inspect-batch --step`); for a spike, each
        instance's share of the loss above the baseline, as `olmo-data spikes` ranks them."""
        if step < 1:
            raise DataError(f"step {step}: steps count from 1")
        return self._recently(("step", step), lambda: self._step(step))

    def _step(self, step: int) -> StepView:
        report = inspect_batch(self.cfg, step=step, source=self.source, doc_index=self.docs, save_folder=self.folder)
        labels = self.sources.of([i.instance for i in report.instances])
        for i, label in zip(report.instances, labels.tolist(), strict=True):
            i.source = i.source or self.sources.labels[label]
        logged = self.metrics.get(step, {}).get("train/batch_fingerprint")
        spike = next((s for s in self._spike_list() if s.step == step), None)
        view = StepView(report, None if logged is None else str(logged), spike)
        if spike is not None and report.loss_record is not None:
            view.excess = excess_shares(report, spike.baseline)
        return view

    def _spike_list(self) -> list[Spike]:
        try:
            return self.spikes().spikes
        except DataError:
            return []

    def pieces(self, instance: InstanceReport) -> list[Piece]:
        """An instance's text, cut at its documents' edges and where the label mask (or the instance filter)
        turns training on or off, each piece decoded on its own."""
        tok = self.tokenizer()
        ids = instance.token_ids
        n = len(ids)
        target = np.ones(n, dtype=bool) if instance.label_mask is None else np.asarray(instance.label_mask, bool)
        if instance.masked:
            target = np.zeros(n, dtype=bool)
        doc_of = np.full(n, -1, dtype=np.int64)
        for k, d in enumerate(instance.documents or []):
            doc_of[d.instance_start : d.instance_end] = k
        cuts = np.flatnonzero((target[1:] != target[:-1]) | (doc_of[1:] != doc_of[:-1])) + 1
        edges = [0, *cuts.tolist(), n]
        return [
            Piece(tok.decode(ids[a:b].tolist()), bool(target[a]), None if doc_of[a] < 0 else int(doc_of[a]))
            for a, b in zip(edges, edges[1:], strict=False)
            if b > a
        ]

    # -- trace ------------------------------------------------------------------------------------------------

    def spans(self, text: str, min_tokens: int = MIN_TOKENS) -> SpansReport:
        """`olmo-data trace CONFIG --spans TEXT --min-tokens N`."""
        return self._recently(
            ("spans", text, min_tokens), lambda: trace_spans(self.config, text, min_tokens=min_tokens), costly=True
        )

    def document(self, doc_id: str) -> tuple[ChainTrace, str | None, int]:
        """`olmo-data trace CONFIG --document ID` (across the stages the run grew from), the document's text from
        this run's token files (its first DOCUMENT_TOKENS tokens; None where this run's data lacks it) and its
        length in tokens."""

        def answer() -> tuple[ChainTrace, str | None, int]:
            chain = trace_chain(self.config, document_ids=[doc_id])
            own = [t for t in chain.own.targets if t.name == doc_id]
            if not own:
                return chain, None, 0
            t = own[0]
            f = self.source.files[t.file_index]
            ids = self.source.read_tokens(f.path, f.dtype, t.start, min(t.end - t.start, DOCUMENT_TOKENS))
            return chain, self.tokenizer().decode(np.asarray(ids).tolist()), t.end - t.start

        return self._recently(("document", doc_id), answer, costly=True)


def _stamp(path: str) -> tuple[float, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime, st.st_size


def excess_shares(report: BatchReport, baseline: float) -> dict[int, float]:
    """Each instance's share of the step's loss above `baseline`, the measure `olmo_data.run.spikes` ranks a spike's
    instances by: (its loss sum - baseline x its supervised tokens) / the step's supervised tokens (a non-finite
    loss ranks first, as there)."""
    total = sum(i.supervised_tokens or 0 for i in report.instances)
    base = baseline if math.isfinite(baseline) else 0.0
    out = {}
    for i in report.instances:
        if i.supervised_tokens is None or not total:
            continue
        if i.loss is None:
            out[i.position] = math.inf if i.supervised_tokens else 0.0
        else:
            out[i.position] = (i.loss - base) * i.supervised_tokens / total
    return out
