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

from olmo_data.config import olmo_core_form
from olmo_data.dataset import DocIndex, InstanceSource
from olmo_data.errors import DataError
from olmo_data.suffix_index import QUERY_END, RunIndex, compare_suffixes, open_index, token_array
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace.find import (
    Target,
    TraceReport,
    check_token_ids,
    open_run,
    parse_steps,
    trace,
)
from olmo_data.trace.scan import scan, scanned_files

MIN_TOKENS = 8
_WEIGHTS = np.random.default_rng(0x5EA4).integers(1, 1 << 63, size=4096, dtype=np.uint64) | np.uint64(1)


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
    places: list[Place]

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

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "min_tokens": self.min_tokens,
            "spans": [{**asdict(s), "steps": s.steps} for s in self.spans],
            "search": self.search,
            "trace": self.trace.to_json(),
        }


# -- L(i) and the places of each span -----------------------------------------------------------------------------


def maximal_spans(longest: np.ndarray, min_tokens: int) -> list[tuple[int, int]]:
    """The maximal spans [i, i + L(i)) of at least `min_tokens`, from L(i) for every start i."""
    out = []
    for i, length in enumerate(longest.tolist()):
        if length >= min_tokens and (i == 0 or int(longest[i - 1]) != length + 1):
            out.append((i, i + length))
    return out


def find_spans(
    source: InstanceSource,
    query: list[int],
    min_tokens: int = MIN_TOKENS,
    *,
    index: RunIndex | None = None,
    processes: int = 1,
    progress: bool | None = None,
) -> tuple[list[tuple[int, int, dict[str, np.ndarray]]], dict[str, Any]]:
    """The maximal spans of `query` and, per span, the positions of each token file that hold it; with the index
    when given, else by a scan; and what the search cost."""
    if min_tokens < 1:
        raise DataError(f"--min-tokens {min_tokens}: expected a positive number of tokens")
    q = np.asarray(query, dtype=np.int64)
    t0 = time.perf_counter()
    out: list[tuple[int, int, dict[str, np.ndarray]]] = []
    if len(q) < min_tokens:
        spans: list[tuple[int, int]] = []
        total = 0
    elif index is not None:
        longest = index.longest(q.tolist(), np.arange(len(q) - min_tokens + 1))
        longest[longest < min_tokens] = 0
        spans = maximal_spans(longest, min_tokens)
        out = [(i, j, index.find(query[i:j])) for i, j in spans]
        total = index.tokens
    else:
        matches, total = scan_matches(source, q, min_tokens, processes=processes, progress=progress)
        longest = np.zeros(len(q) - min_tokens + 1, dtype=np.int64)
        for _, start, length in matches.values():
            np.maximum.at(longest, start, length)
        spans = maximal_spans(longest, min_tokens)
        for i, j in spans:
            found = {}
            for path, (pos, start, length) in matches.items():
                found[path] = np.unique(pos[(start == i) & (length >= j - i)])
            out.append((i, j, found))
    seconds = time.perf_counter() - t0
    return out, {"tokens": total, "seconds": seconds, "index": index is not None}


def scan_matches(
    source: InstanceSource, query: np.ndarray, min_tokens: int, *, processes: int = 1, progress: bool | None = None
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], int]:
    """Per token file: every (position, start i, match length) where the file holds query[i : i + min_tokens],
    the length being how far the match goes on (the longest common prefix of the file there and query[i:])."""
    files = scanned_files(source)
    parts: dict[str, list[np.ndarray]] = {p: [] for p in files}
    for path, found in scan(source, _scan_chunk, (query, min_tokens), processes=processes, progress=progress):
        parts[path].append(found)
    total = sum(n for _, n in files.values())
    out = {}
    for path, pieces in parts.items():
        rows = np.concatenate(pieces) if pieces else np.zeros((0, 3), dtype=np.int64)
        out[path] = (rows[:, 0], rows[:, 1], rows[:, 2])
    return out, total


def _scan_chunk(task: tuple[str, str, int, int, np.ndarray, int]) -> tuple[str, int, np.ndarray]:
    """(position, start, length) rows for the k-grams of the query that begin in tokens [lo, hi) of one file.

    Candidates are positions followed by k tokens that all occur in the query (a table lookup and a running sum);
    their k-grams are hashed and matched against the query's, and confirmed token by token."""
    path, dtype, lo, hi, query, k = task
    tokens = token_array(path, dtype)
    window = np.asarray(tokens[lo : min(hi + k - 1, len(tokens))])
    count = min(hi - lo, len(window) - k + 1)
    empty = (path, hi - lo, np.zeros((0, 3), dtype=np.int64))
    if count <= 0:
        return empty
    top = int(query.max()) + 1
    table = np.zeros(top + 1, dtype=bool)
    table[query] = True
    inside = table[np.minimum(window.astype(np.int64), top)]  # in int64: top may exceed the dtype (65535 + 1)
    running = np.concatenate([[0], np.cumsum(inside, dtype=np.int64)])
    candidates = np.flatnonzero(running[k : k + count] - running[:count] == k)
    if not len(candidates):
        return empty
    weights = _WEIGHTS[np.arange(k) % len(_WEIGHTS)]
    grams = np.lib.stride_tricks.sliding_window_view(query, k)
    with np.errstate(over="ignore"):
        wanted = (grams.astype(np.uint64) * weights).sum(axis=1)
        got = (window[candidates[:, None] + np.arange(k)].astype(np.uint64) * weights).sum(axis=1)
    keep = np.isin(got, wanted)
    candidates = candidates[keep]
    if not len(candidates):
        return empty
    by_hash = np.argsort(wanted, kind="stable")  # a k-gram may occur at several starts of the query
    lo_at = np.searchsorted(wanted[by_hash], got[keep], side="left")
    hi_at = np.searchsorted(wanted[by_hash], got[keep], side="right")
    counts = hi_at - lo_at
    pos = np.repeat(candidates + lo, counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    start = by_hash[np.repeat(lo_at, counts) + within].astype(np.int64)
    padded = np.concatenate([query, np.full(len(query), QUERY_END, dtype=np.int64)])
    length = np.zeros(len(pos), dtype=np.int64)
    for a in range(0, len(pos), 1 << 15):  # bounded memory where a k-gram is very common
        rows = padded[start[a : a + (1 << 15), None] + np.arange(len(query))]
        length[a : a + (1 << 15)], _ = compare_suffixes(tokens, pos[a : a + (1 << 15)], rows, len(tokens))
    ok = length >= k  # the hash matched and so did the tokens
    return path, hi - lo, np.stack([pos[ok], start[ok], length[ok]], axis=1)


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
) -> SpansReport:
    """The maximal spans of `text` (or of token ids `tokens`) found in the training data of `config`'s run, each
    with its documents and the steps (within `steps`, "A..B") that trained on it."""
    if (text is None) == (tokens is None):
        raise DataError(f"--spans: give a text or token ids, {'not both' if text is not None else 'neither was given'}")
    if olmo_core_form(config) is not None:
        raise DataError(
            f"{config}: --spans of an OLMo-core run is not covered; trace a passage of it with --text or --tokens"
        )
    cfg, source = open_run(config)
    tok = data_tokenizer(tokenizer, source, "--spans")
    query = check_token_ids(source, list(tokens), "--spans") if tokens is not None else tok.encode(str(text))
    if not query:
        raise DataError("--spans: the text encodes to no tokens")
    index = open_index(source, index_dir) if use_index else None
    found, search = find_spans(source, query, min_tokens, index=index, processes=processes, progress=progress)
    targets: list[Target] = []
    target_ranges = []
    for i, j, at in found:
        name = tok.decode(query[i:j])
        first = len(targets)
        for k, f in enumerate(source.files):
            targets.extend(Target(name, k, p, p + j - i) for p in at.get(f.path, np.zeros(0, dtype=np.int64)).tolist())
        target_ranges.append((first, len(targets)))
    report = trace(cfg, targets, source=source, steps=parse_steps(steps), world_size=world_size, order=order)
    steps_of: dict[int, set[int]] = {}
    for h in report.hits:
        steps_of.setdefault(h.target, set()).add(h.step)
    docs = DocIndex()
    spans = []
    for (i, j, _), (first, last) in zip(found, target_ranges, strict=True):
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
        spans.append(Span(i, j, tok.decode(query[i:j]), places))
    return SpansReport(query, min_tokens, spans, report, search, _segments(tok, query, found))


def _segments(tok: Any, query: list[int], found: list[tuple[int, int, Any]]) -> list[tuple[str, bool]]:
    """The text cut where covered tokens (the union of the spans, which may overlap) start and stop."""
    covered = np.zeros(len(query), dtype=bool)
    for i, j, _ in found:
        covered[i:j] = True
    cuts = [0, *(np.flatnonzero(covered[1:] != covered[:-1]) + 1).tolist(), len(query)]
    return [(tok.decode(query[a:b]), bool(covered[a])) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def marked_text(report: SpansReport, style: str = "brackets") -> str:
    """The text with the tokens that lie in a span marked: [[ ]] around them, or underlined ("ansi")."""
    opening, closing = ("\x1b[4m", "\x1b[24m") if style == "ansi" else ("[[", "]]")
    return "".join(f"{opening}{s}{closing}" if inside else s for s, inside in report.segments)


def format_spans(report: SpansReport, *, max_places: int = 10) -> str:
    """Each span, where the data holds it (documents), and the steps that trained on it."""
    s = report.search
    how = "the suffix index" if s["index"] else "a scan"
    lines = [
        f"{len(report.spans)} span(s) of at least {report.min_tokens} tokens of the text ({len(report.tokens)} tokens) "
        f"occur in the training data ({s['tokens']:,} tokens, searched with {how} in {s['seconds']:.2f} s)"
    ]
    for n, span in enumerate(report.spans):
        lines.append(
            f"span {n}: tokens [{span.start}, {span.end}) {span.text!r}: {len(span.places)} place(s), "
            f"trained at {len(span.steps)} step(s)"
        )
        for place in span.places[:max_places]:
            docs = ", ".join(f"{d['id']} ({d['src']}:{d['loc']})" for d in place.documents) or "(no metadata)"
            shown = ", ".join(map(str, place.steps[:20])) + (" ..." if len(place.steps) > 20 else "")
            lines.append(
                f"  {docs}, tokens [{place.start}, {place.end}) of {place.path}: "
                + (f"steps {shown}" if place.steps else "not trained in these steps")
            )
        if len(span.places) > max_places:
            lines.append(f"  ... and {len(span.places) - max_places} more places (--json lists them all)")
    if report.spans:
        lines.append("text: " + marked_text(report))
    return "\n".join(lines)
