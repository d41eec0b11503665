"""The Trace page (a text's spans found in the training data), a document's steps, and Stages and data."""

from __future__ import annotations

from typing import Any

from olmo_view.answers import DOCUMENT_TOKENS, MIN_TOKENS, RunAnswers, SpansReport
from olmo_view.markup import Html, el, href, join, number, page
from olmo_view.pages_run import PER_PAGE, paged
from olmo_view.svg import bars

__all__ = ["MAX_TEXT", "document_page", "stages_page", "trace_page"]

MAX_TEXT = 20_000  # characters of pasted text traced
STEPS_SHOWN = 40  # steps listed per place before "and N more"
HITS_PER_PAGE = 100


def _at(step: int, position: int) -> str:
    """The step's page (in batch order) that shows the instance at `position`, scrolled to it."""
    return href(f"/step/{step}", fragment=f"position-{position}", sort="position", page=position // PER_PAGE + 1)


def _step_links(steps: list[int]) -> Html:
    links = [el("a", str(s), href=f"/step/{s}", class_="step-link", data_step=s) for s in steps[:STEPS_SHOWN]]
    more = f" and {len(steps) - STEPS_SHOWN} more" if len(steps) > STEPS_SHOWN else ""
    return (
        join("steps ", [join(link, " ") for link in links], more) if steps else join("not trained in this run's steps")
    )


def _highlighted(report: SpansReport) -> Html:
    """The text with each piece inside a span linking to the first span that covers it (spans may overlap)."""
    covered: list[int | None] = [None] * len(report.tokens)
    for k, span in enumerate(report.spans):
        for t in range(span.start, span.end):
            if covered[t] is None:
                covered[t] = k
    out: list[Html] = []
    edges = [0] + [t for t in range(1, len(covered)) if (covered[t] is None) != (covered[t - 1] is None)]
    for start, (text, inside) in zip(edges, report.segments, strict=True):  # the same cuts `trace --spans` makes
        first = covered[start] if inside else None
        if first is None:
            out.append(el("span", text))
        else:
            k = first
            title = f"span {k}: trained at {len(report.spans[k].steps)} step(s)"
            out.append(el("a", text, href=f"#span-{k}", class_="span-mark", data_span=k, title=title))
    return el("pre", out, class_="traced")


def _span(k: int, span: Any) -> Html:
    places = []
    for p in span.places[:20]:
        docs = [
            join(
                el("a", d["id"], href=href("/document", id=d["id"]), class_="doc-link"),
                f" ({d['src']} line {d['loc']}) ",
            )
            for d in p.documents
        ]
        places.append(
            el("li", docs or "(no metadata)", f"tokens [{p.start}, {p.end}) of {p.path}: ", _step_links(p.steps))
        )
    more = el("p", f"... and {len(span.places) - 20} more places") if len(span.places) > 20 else None
    return el(
        "section",
        el("h3", f"span {k}: tokens [{span.start}, {span.end})"),
        el("pre", span.text, class_="span-text"),
        el(
            "p",
            f"{len(span.places)} place(s) in the data; trained at {len(span.steps)} step(s): ",
            _step_links(span.steps),
            class_="span-steps",
        ),
        el("ul", places, class_="places"),
        more,
        id=f"span-{k}",
        class_="span",
        data_steps=",".join(map(str, span.steps)),
    )


def trace_page(answers: RunAnswers, text: str | None, min_tokens_asked: int | None) -> bytes:
    min_tokens = min_tokens_asked or MIN_TOKENS
    form = el(
        "form",
        el(
            "label",
            "Paste a text (a model's continuation, say): its spans found verbatim in the training data",
            el("textarea", text or "", name="text", rows=6, maxlength=MAX_TEXT, required=True),
        ),
        el("label", "shortest span (tokens) ", el("input", type="number", name="min_tokens", value=min_tokens, min=1)),
        el("button", "trace"),
        action="/trace",
        method="get",
        class_="trace",
    )
    lookup = el(
        "form",
        el(
            "label",
            "or a document id: the steps that trained on it ",
            el("input", type="text", name="id", required=True),
        ),
        el("button", "find its steps"),
        action="/document",
        method="get",
        class_="inline",
    )
    body: list[object] = [form, lookup]
    if text:
        report = answers.spans(text[:MAX_TEXT], min_tokens)
        s = report.search
        how = "the suffix index" if s["index"] else "a scan"
        body += [
            el("h2", "Spans"),
            el(
                "p",
                f"{len(report.spans)} span(s) of at least {report.min_tokens} tokens of the text ({len(report.tokens)} "
                f"tokens) occur in the training data ({s['tokens']:,} tokens, searched with {how} in "
                f"{s['seconds']:.2f} s)",
                class_="meta",
            ),
            _highlighted(report),
            [_span(k, span) for k, span in enumerate(report.spans)],
        ]
    return page("Trace", answers.name, *body, current="/trace")


def document_page(answers: RunAnswers, doc_id: str, page_number: int) -> bytes:
    chain, text, length = answers.document(doc_id)
    body: list[object] = []
    for st in chain.stages:
        stage = st.stage
        own = stage.index == 0
        body.append(el("h2", f"{'this run' if own else 'stage ' + str(stage.index)}: {stage.run_name}"))
        body.append(
            el(
                "p",
                f"config {stage.config} · steps {stage.first_step}.."
                f"{stage.last_step if stage.last_step is not None else '?'}"
                + (f" · from checkpoint {stage.checkpoint}" if stage.checkpoint else ""),
                class_="meta",
            )
        )
        if st.report is None:
            body.append(el("p", st.why or stage.note or "not traced", class_="note"))
            continue
        hits = st.report.hits
        body.append(
            el("p", f"{len(hits)} place(s) trained: {len({h.step for h in hits})} step(s)", class_="hits-count")
        )
        shown, pager = paged(hits, page_number if own else 1, HITS_PER_PAGE, "/document", id=doc_id)
        rows = [
            el(
                "tr",
                el(
                    "td",
                    el("a", str(h.step), href=_at(h.step, h.position), class_="step-link") if own else str(h.step),
                ),
                el("td", str(h.position)),
                el("td", "-" if h.rank is None else str(h.rank)),
                el("td", str(h.instance)),
                el("td", f"[{h.instance_start}, {h.instance_end})"),
                el("td", f"[{h.target_start}, {h.target_end})"),
            )
            for h in shown
        ]
        if rows:
            head = el(
                "tr",
                [el("th", c) for c in ("step", "position", "rank", "instance", "instance tokens", "document tokens")],
            )
            cut = None if own or len(hits) <= HITS_PER_PAGE else f"the first {HITS_PER_PAGE} of {len(hits)} shown"
            body += [pager if own else None, el("table", head, rows, class_="hits"), pager if own else el("p", cut)]
    if text is not None:
        size = f"its first {DOCUMENT_TOKENS:,} of {length:,}" if length > DOCUMENT_TOKENS else f"{length:,}"
        body += [
            el("h2", f"Its text ({size} tokens of this run's data, decoded)"),
            el("pre", text, class_="text document"),
        ]
    return page(f"Document {doc_id}", answers.name, *body, current="/trace")


def _short(name: str) -> str:
    """A source's label in a chart: a tokenized directory by its base name (the table below names it in full)."""
    return name.rstrip("/").rsplit("/", 1)[-1] or name


def stages_page(answers: RunAnswers) -> bytes:
    stages = answers.stages()
    rows = [
        el(
            "tr",
            el("td", str(s.index)),
            el("td", s.source),
            el("td", s.run_name),
            el("td", s.config or "-"),
            el("td", s.checkpoint or "-"),
            el(
                "td",
                f"{s.first_step}..{s.last_step if s.last_step is not None else '?'}"
                + (" (planned)" if s.planned else ""),
            ),
            el("td", number(s.tokens_trained)),
            el("td", s.note or ""),
        )
        for s in stages
    ]
    total = sum(s.tokens_trained or 0 for s in stages)
    head = el(
        "tr", [el("th", c) for c in ("stage", "kind", "run", "config", "checkpoint", "steps", "tokens trained", "note")]
    )
    body: list[object] = [
        el("h2", "Lineage (olmo-data lineage)"),
        el("table", head, rows, class_="stages"),
        el("p", f"{total:,} tokens trained in all stages", class_="meta"),
    ]
    st = answers.stats()
    docs = f"{st.documents:,} documents, " if st.documents is not None else ""
    body += [
        el("h2", "Data (olmo-data stats)"),
        el(
            "p",
            f"{docs}{st.file_tokens:,} tokens in {len(st.files)} files; {st.num_instances:,} instances of "
            f"{st.sequence_length} tokens"
            + (
                f"; {st.steps:,} steps = {st.epochs:.2f} epochs"
                if st.steps is not None and st.epochs is not None
                else ""
            ),
            class_="meta",
        ),
        bars(
            "mixture share of each source (of the dataset's instances)",
            [(_short(s.name), s.share * 100) for s in st.sources],
            unit=" %",
        ),
        el(
            "table",
            el("tr", [el("th", c) for c in ("source", "files", "tokens", "documents", "instances", "share")]),
            [
                el(
                    "tr",
                    el("td", s.name),
                    el("td", str(s.files)),
                    el("td", number(s.tokens)),
                    el("td", number(s.documents)),
                    el("td", number(s.instances)),
                    el("td", f"{s.share:.2%}"),
                )
                for s in st.sources
            ],
            class_="sources",
        ),
    ]
    if st.length_histogram:
        pct = ", ".join(f"{k} {v:,.0f}" for k, v in st.document_lengths.items())
        body += [
            bars(
                "documents by length (tokens)",
                [(f"[{lo:,}, {hi:,})", float(n)) for lo, hi, n in st.length_histogram],
                digits=0,
            ),
            el("p", f"document lengths: {pct}", class_="meta"),
        ]
    return page("Stages and data", answers.name, *body, current="/stages")
