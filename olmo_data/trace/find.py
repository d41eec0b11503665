"""Provenance in reverse: which training steps saw a document, a source file's documents, or a passage.

`inspect-batch` answers "what did step N train on"; this answers the opposite question that memorisation,
contamination and attribution studies ask. The chain is the same, walked backwards:

  document id / source glob (tokenize metadata)  or  token sequence (a scan of the token files)
    -> token span [start, end) of a token file
    -> the instances cut from that span (OLMo's per-file rule: instance j holds tokens [j*L, (j+1)*L))
    -> through a mix: the dataset indices that select those instances (none if down-sampled away, several if
       repeated)
    -> their positions in each epoch's order (a vectorised membership test over the order)
    -> step = epoch * batches_per_epoch + position // GBS + 1, rank = (position % GBS) % world_size.

Only the order is read in full (a memory map; one pass per epoch); documents and instances are found by binary
search in the side indexes `inspect-batch` uses.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.config import TrainConfig, read_run_config
from olmo_data.dataset import DTYPES, DocIndex, InstanceSource, open_from_config
from olmo_data.errors import DataError
from olmo_data.run import RunData, read_run
from olmo_data.suffix_index import RunIndex, open_index
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace.scan import scan, scanned_files, scanned_tokens


@dataclass(frozen=True)
class Target:
    """A run of tokens to trace: a whole document, or one place where a searched sequence occurs."""

    name: str  # the document id, or the searched text / tokens
    file_index: int  # in InstanceSource.files
    start: int  # tokens [start, end) of that token file
    end: int
    src: str | None = None  # the document's source file and line, where known
    loc: int | None = None


@dataclass(frozen=True)
class Hit:
    """One place where a target was trained: a step, a position in its global batch, an instance, a span."""

    target: int  # index into TraceReport.targets
    step: int
    epoch: int
    batch_in_epoch: int
    position: int  # in the global batch
    rank: int | None  # for the world size asked about
    instance: int  # dataset index (what the order holds)
    path: str  # token file
    instance_start: int  # the trained tokens of the target, as positions within the instance [start, end)
    instance_end: int
    target_start: int  # ... and as positions within the target (token 0 = the document's first token)
    target_end: int
    supervised: int | None = None  # of those tokens, how many the label mask trains (SFT data), else None


@dataclass
class TraceReport:
    targets: list[Target]
    hits: list[Hit]
    first_step: int
    last_step: int
    global_batch_size: int
    sequence_length: int
    world_size: int | None
    scan: dict[str, float] | None = None  # tokens scanned, seconds, tokens per second (--text / --tokens)
    not_trained: list[int] = field(default_factory=list)  # targets no step in the range saw

    def to_json(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "global_batch_size": self.global_batch_size,
            "sequence_length": self.sequence_length,
            "world_size": self.world_size,
            "targets": [asdict(t) for t in self.targets],
            "hits": [asdict(h) for h in self.hits],
            "scan": self.scan,
        }


# -- finding the targets --------------------------------------------------------------------------------------


def find_documents(
    source: InstanceSource,
    ids: Sequence[str] = (),
    source_glob: str | None = None,
    doc_index: DocIndex | None = None,
    missing_ok: bool = False,
) -> list[Target]:
    """The token spans of documents named by id, or of every document whose source file matches a glob.

    Ids are looked up in each token file's metadata index (built once, cached); an id found nowhere is an error
    that names it, since a typo would otherwise read as "never trained" (unless `missing_ok`: one stage of a
    lineage need not hold every document the others do).
    """
    docs = doc_index or DocIndex()
    wanted = {i.encode("utf-8") for i in ids}
    found: set[bytes] = set()
    out: list[Target] = []
    docs.prepare((f.path, f.metadata_path) for f in source.files)  # every file's metadata or index head at once
    indexes = [docs.index_for(f.path, f.metadata_path, f.num_tokens) for f in source.files]
    present = [k for k, index in enumerate(indexes) if index is not None]
    chosen = [index for index in indexes if index is not None]
    by_id = docs.rows_with_ids(chosen, list(ids)) if wanted else [[] for _ in present]  # each index's rows of the ids
    for k, id_rows in zip(present, by_id, strict=True):  # a file a mix lists in two sources is two places to look
        index = indexes[k]
        assert index is not None
        rows: list[int] = list(id_rows)
        if source_glob is not None:
            codes = [c for c, s in enumerate(index.sources) if fnmatch.fnmatch(s, source_glob)]
            if codes:
                rows.extend(np.flatnonzero(np.isin(index.src_codes, codes)).tolist())
        for r in sorted(set(rows)):
            doc_id, src, loc, start, end = index.doc(r)
            found.add(doc_id.encode("utf-8"))
            out.append(Target(doc_id, k, start, end, src, loc))
    missing = sorted(i.decode("utf-8") for i in wanted - found)
    if missing_ok:
        return out
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DataError(f"document id {shown} not found in the metadata of the run's token files; check the id")
    if source_glob is not None and not out:
        raise DataError(f"no document of the run's token files comes from a source file matching {source_glob!r}")
    return out


def find_tokens(
    source: InstanceSource,
    sequence: Sequence[int],
    *,
    name: str,
    processes: int = 1,
    progress: bool | None = None,
    index: RunIndex | None = None,
) -> tuple[list[Target], dict[str, float]]:
    """Every place the token files hold `sequence` exactly: from the suffix index (`olmo-data index`) when given,
    else by a vectorised scan of memory-mapped files (in chunks that overlap by len(sequence) - 1 tokens, spread
    over `processes`); and the search's rate."""
    if not sequence:
        raise DataError("nothing to search for: the text encodes to no tokens")
    if index is not None:
        t0 = time.perf_counter()
        at = index.find(sequence)
        seconds = time.perf_counter() - t0
        n = len(sequence)
        targets = [Target(name, k, p, p + n) for k, f in enumerate(source.files) for p in at[f.path].tolist()]
        return targets, {"tokens": float(index.tokens), "seconds": seconds, "index": 1.0}
    seq = np.asarray(sequence, dtype=np.int64)
    total = scanned_tokens(scanned_files(source))
    t0 = time.perf_counter()
    found: dict[str, list[int]] = {f.path: [] for f in source.files}
    for path, hits in scan(source, _scan_chunk, (seq,), processes=processes, progress=progress):
        found[path].extend(hits)
    seconds = time.perf_counter() - t0
    targets = [Target(name, k, at, at + len(seq)) for k, f in enumerate(source.files) for at in sorted(found[f.path])]
    return targets, {"tokens": float(total), "seconds": seconds, "tokens_per_second": total / max(seconds, 1e-9)}


def _scan_chunk(task: tuple[str, str, int, int, np.ndarray]) -> tuple[str, int, list[int]]:
    """Start offsets of `seq` that begin in tokens [lo, hi) of one token file."""
    path, dtype, lo, hi, seq = task
    tokens = np.memmap(path, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<"), mode="r")
    window = np.asarray(tokens[lo : min(hi + len(seq) - 1, len(tokens))])
    candidates = np.flatnonzero(window[: max(0, min(hi - lo, len(window) - len(seq) + 1))] == seq[0])
    for i in range(1, len(seq)):
        candidates = candidates[window[candidates + i] == seq[i]]
    return path, hi - lo, (candidates + lo).tolist()


# -- from targets to steps ------------------------------------------------------------------------------------


def trace(
    config: str | dict[str, Any] | TrainConfig,
    targets: Sequence[Target],
    *,
    source: InstanceSource | None = None,
    steps: tuple[int, int] | None = None,
    world_size: int | None = None,
    order: str | None = None,
) -> TraceReport:
    """`trace_run` of the run `config` describes (`source`: its instances, where the caller has them open)."""
    return trace_run(read_run(config, source=source, order=order), targets, steps=steps, world_size=world_size)


def trace_run(
    run: RunData, targets: Sequence[Target], *, steps: tuple[int, int] | None = None, world_size: int | None = None
) -> TraceReport:
    """Every (step, position) of the run whose instance holds a token of a target, within `steps` (1-based,
    inclusive; default the whole run): the instances holding each target's tokens (`RunData.holding`: every
    occurrence of a file in a mix, a packed instance's pieces), then the steps whose batches held them (one pass
    over each epoch's order, whatever the number of instances)."""
    if steps is None:
        last = run.run_steps()
        if last is None:
            raise DataError(f"{run.config}: the config gives no max_duration (trainer.max_duration); pass --steps A..B")
        steps = (1, last)
    first, last = steps
    if first < 1 or last < first:
        raise DataError(f"--steps {first}..{last}: expected 1 <= A <= B")
    per_batch = run.batch_size(first)
    if world_size is not None and (world_size < 1 or per_batch % world_size):
        raise DataError(f"--world-size {world_size} must divide the global batch size {per_batch}")
    if world_size is not None:
        run.check_world(first, world_size)
    holding = [run.holding(t.file_index, t.start, t.end) for t in targets]
    found = run.trained_at([h.instance for held in holding for h in held], first, last)
    paths = [f.path for f in run.token_files()]
    hits: list[Hit] = []
    for t, (target, held) in enumerate(zip(targets, holding, strict=True)):
        for h in held:  # file tokens [h.file_start, h.file_start + h.tokens) from instance position h.at
            lo, hi = max(target.start, h.file_start), min(target.end, h.file_start + h.tokens)
            if hi <= lo or not found[h.instance]:
                continue
            a, b = lo - h.file_start + h.at, hi - h.file_start + h.at
            supervised = run.supervised(h.instance, a, b)
            for at in found[h.instance]:
                hits.append(
                    Hit(
                        target=t,
                        step=at.step,
                        epoch=at.epoch,
                        batch_in_epoch=at.batch_in_epoch,
                        position=at.position,
                        rank=run.rank_of(at.step, at.position, world_size) if world_size else None,
                        instance=h.instance,
                        path=paths[target.file_index],
                        instance_start=a,
                        instance_end=b,
                        target_start=lo - target.start,
                        target_end=hi - target.start,
                        supervised=supervised,
                    )
                )
    hits.sort(key=lambda h: (h.step, h.position, h.target))
    trained = {h.target for h in hits}
    return TraceReport(
        targets=list(targets),
        hits=hits,
        first_step=first,
        last_step=last,
        global_batch_size=per_batch,
        sequence_length=run.sequence_length,
        world_size=world_size,
        not_trained=[t for t in range(len(targets)) if t not in trained],
    )


def open_run(config: str) -> tuple[TrainConfig, InstanceSource]:
    """A run's config, read as the trainer reads it, and its data."""
    cfg = read_run_config(config)
    return cfg, open_from_config(cfg)


def read_ids(document_ids: Sequence[str], document_list: str | None) -> list[str]:
    """The ids of `--document` and of a `--document-list` file (one per line)."""
    ids = list(document_ids)
    if document_list is not None:
        try:
            ids += [x.strip() for x in Path(document_list).read_text().splitlines() if x.strip()]
        except OSError as e:
            raise DataError(f"{document_list}: cannot read the id list ({e.strerror})") from e
    return ids


def find_targets(
    source: InstanceSource,
    ids: Sequence[str],
    *,
    source_glob: str | None = None,
    text: str | None = None,
    tokens: str | None = None,
    tokenizer: str | None = None,
    processes: int = 1,
    progress: bool | None = None,
    missing_ok: bool = False,
    index_dir: str | None = None,
    use_index: bool = True,
) -> tuple[list[Target], dict[str, float] | None]:
    """The targets as `olmo-data trace` names them (documents by id or source glob, or one passage as text or
    token ids) in one run's data, and the scan's rate for a passage (None when the suffix index answered)."""
    check_target_options(ids, source_glob, text, tokens)
    if text is None and tokens is None:
        return find_documents(source, ids, source_glob, missing_ok=missing_ok), None
    if tokens is not None:
        sequence, name = check_token_ids(source, parse_token_ids(tokens), "--tokens"), tokens
    else:
        sequence, name = data_tokenizer(tokenizer, source, "--text").encode(str(text)), str(text)
    index = open_index(source, index_dir) if use_index else None
    return find_tokens(source, sequence, name=name, processes=processes, progress=progress, index=index)


def check_target_options(ids: Sequence[str], source_glob: str | None, text: str | None, tokens: str | None) -> None:
    """Documents (ids, a source glob) or one passage (text or tokens), not both, not none."""
    searches = (text is not None) + (tokens is not None)
    if searches > 1 or (searches and (ids or source_glob)) or not (searches or ids or source_glob):
        raise DataError("give documents (--document, --document-list, --source) or one of --text and --tokens")


def parse_token_ids(value: str) -> list[int]:
    """`--tokens`: token ids separated by commas (spaces allowed)."""
    try:
        return [int(x) for x in value.replace(" ", "").split(",") if x]
    except ValueError as e:
        raise DataError(f"--tokens {value!r}: expected token ids separated by commas") from e


def check_token_ids(source: InstanceSource, ids: list[int], option: str) -> list[int]:
    """Token ids the run's token files can hold: a negative id or one above every file's dtype matches nothing in
    a scan, and -1 would match the suffix index's past-the-end marker, so both are refused rather than answered."""
    top = max(int(np.iinfo(DTYPES[f.dtype]).max) for f in source.files)
    bad = [t for t in ids if not 0 <= t <= top]
    if bad:
        raise DataError(f"{option}: token id {bad[0]} is outside 0..{top}, the ids the run's token files can hold")
    return ids


def parse_steps(value: str | None) -> tuple[int, int] | None:
    """`--steps`: "A..B" (1-based steps, inclusive) or one step "N"; None (the whole run) when not given."""
    if value is None:
        return None
    a, sep, b = value.partition("..")
    try:
        return (int(a), int(b)) if sep else (int(a), int(a))
    except ValueError as e:
        raise DataError(f"--steps {value!r}: expected A..B (1-based steps, inclusive) or one step N") from e


def format_trace(report: TraceReport, *, max_targets: int = 20) -> str:
    """Grouped by step: each step that trained a target, with where in the batch and which tokens."""
    lines: list[str] = []
    n = len(report.targets)
    steps = sorted({h.step for h in report.hits})
    lines.append(
        f"{_count(n, 'target')} traced through steps {report.first_step}..{report.last_step} "
        f"({report.global_batch_size} instances of {report.sequence_length} tokens per step): "
        f"{_count(len(report.hits), 'place')} in {_count(len(steps), 'step')}"
    )
    if report.scan and report.scan.get("index"):
        s = report.scan
        lines.append(f"looked up in the suffix index of {s['tokens']:,.0f} tokens in {s['seconds']:.3f} s")
    elif report.scan:
        s = report.scan
        lines.append(
            f"searched {s['tokens']:,.0f} tokens in {s['seconds']:.2f} s "
            f"({s['tokens_per_second'] / 1e6:,.1f}M tokens/s)"
        )
    if report.scan and not report.targets:
        lines.append(
            "no token file holds this token sequence. In running text a passage may be tokenized differently: a "
            "leading space or newline changes the first token; try the passage with its leading space, or give "
            "the ids inspect-batch shows with --tokens"
        )
    for t, target in enumerate(report.targets[:max_targets]):
        where = f"{target.src}:{target.loc}, " if target.src else ""
        lines.append(
            f"  [{t}] {target.name!r} ({where}{target.end - target.start:,} tokens at [{target.start}, {target.end}) "
            f"of token file {target.file_index})"
        )
    if n > max_targets:
        lines.append(f"  ... and {n - max_targets} more (--json lists them all)")
    current = None
    for h in report.hits:
        if h.step != current:
            current = h.step
            lines.append(f"step {h.step} (epoch {h.epoch}, batch {h.batch_in_epoch})")
        rank = f", rank {h.rank}" if h.rank is not None else ""
        sup = f", {h.supervised} supervised" if h.supervised is not None else ""
        lines.append(
            f"  position {h.position}{rank}: instance {h.instance} tokens [{h.instance_start}, {h.instance_end}) = "
            f"[{h.target}] tokens [{h.target_start}, {h.target_end}){sup}"
        )
    if report.not_trained:
        names = ", ".join(f"[{t}]" for t in report.not_trained[:10])
        lines.append(
            f"not trained in steps {report.first_step}..{report.last_step}: {names}"
            + (f" and {len(report.not_trained) - 10} more" if len(report.not_trained) > 10 else "")
            + " (in a file's tail that no instance holds, down-sampled away by a mix, or only in other steps)"
        )
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
