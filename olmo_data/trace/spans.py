"""`olmo-data trace --spans`: which spans of a text occur verbatim in a run's training data, in which documents,
and at which steps (OLMoTrace's question, answered through the run's exact order).

A span is a run of the text's tokens (encoded with the data's tokenizer) of at least `min_tokens` that the token
files hold somewhere, and that is maximal: one token more on either side and the data no longer holds it. Found
from L(i), the longest prefix of tokens[i:] the data holds: [i, i + L(i)) cannot grow to the right, and can grow
to the left exactly when L(i - 1) = L(i) + 1.

L(i) comes from the suffix index (`olmo-data index`) when the run has one, else from a scan of every token that
finds each `min_tokens`-gram of the text and extends it; both give the same spans and places. Then the places go
through `trace`: token span -> instances -> steps.

The token files are searched as the trainer reads them: documents one after another with their EOS tokens. A span
can cross a document boundary only if the text holds the EOS token between them; such a place lists both
documents.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from olmo_data.dataset import DocIndex, InstanceSource
from olmo_data.display import marked
from olmo_data.errors import DataError
from olmo_data.run import read_run
from olmo_data.suffix_index import RunIndex, open_index
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace.find import Target, TraceReport, check_token_ids, parse_steps, trace_run
from olmo_data.trace.span_search import index_longest, index_places, scan_longest

MIN_TOKENS = 8
MAX_PLACES = 1000  # places of a span listed (and traced to steps); the rest are counted


@dataclass
class Place:
    """One place in the token files that holds a span, and what it belongs to."""

    path: str
    start: int  # tokens [start, end) of the token file
    end: int
    documents: list[dict[str, Any]]  # id, src, loc, start, end of each document it overlaps (none without metadata)
    targets: list[int]  # in SpansReport.trace.targets: one per place the run's sources list this file
    steps: list[int]  # the steps that trained a token of it


@dataclass
class Span:
    start: int  # tokens [start, end) of the text
    end: int
    text: str
    places: list[Place]  # the first `max_places` (by file, in the run's order, then position)
    count: int = 0  # the places that hold it in all

    @property
    def unlisted(self) -> int:
        return self.count - len(self.places)

    @property
    def steps(self) -> list[int]:
        return sorted({s for p in self.places for s in p.steps})


@dataclass
class SpansReport:
    tokens: list[int]
    min_tokens: int
    spans: list[Span]
    trace: TraceReport
    search: dict[str, Any]  # tokens searched, seconds, and whether the index answered
    segments: list[tuple[str, bool]] = field(default_factory=list)  # the text in pieces: (text, inside a span)
    max_places: int = MAX_PLACES

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "min_tokens": self.min_tokens,
            "max_places": self.max_places,
            "spans": [{**asdict(s), "unlisted": s.unlisted, "steps": s.steps} for s in self.spans],
            "search": self.search,
            "trace": self.trace.to_json(),
        }


# -- L(i) and the places of each span -----------------------------------------------------------------------------


def maximal_spans(longest: np.ndarray, min_tokens: int) -> list[tuple[int, int]]:
    """The maximal spans [i, i + L(i)) of at least `min_tokens`, from L(i) for every start i (exact where at least
    `min_tokens`: a smaller one never equals L(i) + 1 of a span)."""
    previous = np.concatenate([[-1], longest[:-1]])
    starts = np.flatnonzero((longest >= min_tokens) & (previous != longest + 1))
    return [(i, i + int(longest[i])) for i in starts.tolist()]


def find_spans(
    source: InstanceSource,
    query: list[int],
    min_tokens: int = MIN_TOKENS,
    *,
    index: RunIndex | None = None,
    processes: int = 1,
    progress: bool | None = None,
    max_places: int = MAX_PLACES,
) -> tuple[list[tuple[int, int, dict[str, np.ndarray], int]], dict[str, Any]]:
    """The maximal spans of `query` and, per span, the first `max_places` positions of each token file that hold
    it (by file, in the run's order, then position) and how many positions hold it in all; with the index when
    given, else by a scan (span_search); and what the search cost."""
    if min_tokens < 1:
        raise DataError(f"--min-tokens {min_tokens}: expected a positive number of tokens")
    if max_places < 0:
        raise DataError(f"--max-places {max_places}: expected a number of places, 0 or more")
    q = np.asarray(query, dtype=np.int64)
    t0 = time.perf_counter()
    out: list[tuple[int, int, dict[str, np.ndarray], int]] = []
    if len(q) < min_tokens:
        total = 0
    elif index is not None:
        longest = index_longest(index, q, progress, min_tokens)
        spans = maximal_spans(longest, min_tokens)
        counts, places = index_places(index, q, spans, max_places)
        out = [(i, j, at, c) for (i, j), at, c in zip(spans, places, counts, strict=True)]
        total = index.tokens
    else:
        longest, count, kept, total = scan_longest(
            source, q, min_tokens, max_places, processes=processes, progress=progress
        )
        out = [(i, j, kept.of(i), int(count[i])) for i, j in maximal_spans(longest, min_tokens)]
    seconds = time.perf_counter() - t0
    return out, {"tokens": total, "seconds": seconds, "index": index is not None}


# -- through the run ----------------------------------------------------------------------------------------------


def trace_spans(
    config: str,
    text: str | None = None,
    *,
    tokens: list[int] | None = None,
    min_tokens: int = MIN_TOKENS,
    tokenizer: str | None = None,
    steps: str | None = None,
    world_size: int | None = None,
    order: str | None = None,
    processes: int = 1,
    progress: bool | None = None,
    index_dir: str | None = None,
    use_index: bool = True,
    max_places: int = MAX_PLACES,
) -> SpansReport:
    """The maximal spans of `text` (or of token ids `tokens`) found in the training data of `config`'s run, each
    with its documents and the steps (within `steps`, "A..B") that trained on it: of the first `max_places` places
    of a span, the rest counted only, so that a span the data holds a million times costs no more than that."""
    if (text is None) == (tokens is None):
        raise DataError(f"--spans: give a text or token ids, {'not both' if text is not None else 'neither was given'}")
    if max_places < 0:
        raise DataError(f"--max-places {max_places}: expected a number of places, 0 or more")
    run = read_run(config, order=order)
    source = run.target_source()
    tok = data_tokenizer(tokenizer, source, "--spans")
    query = check_token_ids(source, list(tokens), "--spans") if tokens is not None else tok.encode(str(text))
    if not query:
        raise DataError("--spans: the text encodes to no tokens")
    index = open_index(source, index_dir) if use_index and run.finds_with_index else None
    found, search = find_spans(
        source, query, min_tokens, index=index, processes=processes, progress=progress, max_places=max_places
    )
    targets: list[Target] = []
    target_ranges = []
    for i, j, at, _ in found:
        name = tok.decode(query[i:j])
        first = len(targets)
        for k, f in enumerate(source.files):
            targets.extend(Target(name, k, p, p + j - i) for p in at.get(f.path, np.zeros(0, dtype=np.int64)).tolist())
        target_ranges.append((first, len(targets)))
    report = trace_run(run, targets, steps=parse_steps(steps), world_size=world_size)
    steps_of: dict[int, set[int]] = {}
    for h in report.hits:
        steps_of.setdefault(h.target, set()).add(h.step)
    docs = DocIndex()
    spans = []
    for (i, j, _, count), (first, last) in zip(found, target_ranges, strict=True):
        by_place: dict[tuple[str, int], list[int]] = {}
        for t in range(first, last):
            by_place.setdefault((source.files[targets[t].file_index].path, targets[t].start), []).append(t)
        places: list[Place] = []
        for (path, start), ts in sorted(by_place.items()):
            f = source.files[targets[ts[0]].file_index]
            found_docs = docs.lookup(path, start, start + j - i, f.metadata_path, f.num_tokens) or []
            documents = [{"id": d.id, "src": d.src, "loc": d.loc, "start": d.start, "end": d.end} for d in found_docs]
            trained = sorted(set().union(*(steps_of.get(t, set()) for t in ts)))
            places.append(Place(path, start, start + j - i, documents, ts, trained))
        spans.append(Span(i, j, tok.decode(query[i:j]), places, count))
    return SpansReport(query, min_tokens, spans, report, search, _segments(tok, query, found), max_places)


def _segments(tok: Any, query: list[int], found: list[tuple[int, int, Any, int]]) -> list[tuple[str, bool]]:
    """The text cut where covered tokens (the union of the spans, which may overlap) start and stop."""
    covered = np.zeros(len(query), dtype=bool)
    for i, j, _, _ in found:
        covered[i:j] = True
    cuts = [0, *(np.flatnonzero(covered[1:] != covered[:-1]) + 1).tolist(), len(query)]
    return [(tok.decode(query[a:b]), bool(covered[a])) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def marked_text(report: SpansReport) -> str:
    """The text with the tokens that lie in a span marked [[ ]] (`olmo_data.display.marked`: one marking for
    `trace --spans`, `generate --trace` and `inspect-batch --decode`, on a terminal and in a pipe alike)."""
    return marked(report.segments)


def format_spans(report: SpansReport, *, max_places: int = 10) -> str:
    """Each span, where the data holds it (documents), and the steps that trained on it."""
    s = report.search
    how = "the suffix index" if s["index"] else "a scan"
    lines = [
        f"{len(report.spans)} span(s) of at least {report.min_tokens} tokens of the text ({len(report.tokens)} tokens) "
        f"occur in the training data ({s['tokens']:,} tokens, searched with {how} in {s['seconds']:.2f} s)"
    ]
    for n, span in enumerate(report.spans):
        listed = f" (the {len(span.places)} listed)" if span.unlisted else ""
        lines.append(
            f"span {n}: tokens [{span.start}, {span.end}) {span.text!r}: {span.count} place(s), "
            f"trained at {len(span.steps)} step(s){listed}"
        )
        for place in span.places[:max_places]:
            docs = ", ".join(f"{d['id']} ({d['src']}:{d['loc']})" for d in place.documents) or "(no metadata)"
            shown = ", ".join(map(str, place.steps[:20])) + (" ..." if len(place.steps) > 20 else "")
            lines.append(
                f"  {docs}, tokens [{place.start}, {place.end}) of {place.path}: "
                + (f"steps {shown}" if place.steps else "not trained in these steps")
            )
        listed_here = min(max_places, len(span.places))
        if span.count > listed_here:
            more = f"--json lists {len(span.places)}" + ("; the others are counted only" if span.unlisted else "")
            lines.append(f"  ... and {span.count - listed_here} more places ({more})")
    if report.spans:
        lines.append("text ([[ ]]: in the training data): " + marked_text(report))
    return "\n".join(lines)
