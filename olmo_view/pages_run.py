"""The Run page (curves, spikes) and the Step page (a batch as `inspect-batch` rebuilds it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from olmo_view.answers import DataError, RunAnswers, StepView
from olmo_view.markup import Html, el, href, join, number, page
from olmo_view.svg import Mark, Series, line_chart

__all__ = ["PER_PAGE", "paged", "run_page", "step_page"]

PER_PAGE = 8  # instances per page of a step
SPIKES_PER_PAGE = 50
SORTS = ("position", "loss", "excess")


def paged(items: Sequence[Any], number_: int, per_page: int, route: str, **query: Any) -> tuple[list[Any], Html]:
    """Page `number_` (1-based) of `items`, and the links to the others (none when one page holds them all)."""
    pages = max(1, math.ceil(len(items) / per_page))
    number_ = min(max(1, number_), pages)
    chosen = list(items[(number_ - 1) * per_page : number_ * per_page])
    if pages == 1:
        return chosen, Html("")
    links = [
        el("a", str(p), href=href(route, page=p, **query), class_="current" if p == number_ else None)
        for p in range(1, pages + 1)
    ]
    return chosen, el("nav", "pages: ", links, class_="pager")


def _spike_note(s: Any) -> str:
    z = "inf (flat baseline)" if not math.isfinite(s.z) else f"{s.z:.1f}"
    loss = number(s.loss) if math.isfinite(s.loss) else "not finite (the step diverged)"
    return f"loss {loss}, baseline {number(s.baseline)} ± {number(s.std)}, z {z}"


def run_page(answers: RunAnswers, page_number: int = 1) -> bytes:
    curves = answers.curves()
    body: list[object] = [
        el(
            "p",
            f"config {answers.config} · save folder {answers.folder} · {len(answers.metrics)} steps logged",
            class_="meta",
        ),
        el(
            "form",
            el("label", "open step ", el("input", type="number", name="n", min=1, required=True)),
            el("button", "show its batch"),
            action="/step",
            method="get",
            class_="inline",
        ),
    ]
    try:
        report = answers.spikes()
        spikes, why = report.spikes, None
    except DataError as e:  # said on the page; the curves are still drawn
        spikes, why = [], str(e)
    marks = []
    for s in spikes:
        value = s.loss if math.isfinite(s.loss) else math.inf
        marks.append(
            Mark(s.step, value, f"spike at step {s.step}: {_spike_note(s)}", href(f"/step/{s.step}", sort="excess"))
        )
    if "train/loss" in curves:
        body.append(
            line_chart(
                "train/loss (spikes marked: click one to open its step)",
                [Series("train/loss", *curves["train/loss"])],
                marks,
            )
        )
    if "train/z_loss" in curves:
        body.append(line_chart("train/z_loss", [Series("train/z_loss", *curves["train/z_loss"])]))
    per_source = [
        Series(k.removeprefix("train/source/").removesuffix("/loss"), *v)
        for k, v in sorted(curves.items())
        if k.startswith("train/source/")
    ]
    if per_source:
        body.append(line_chart("loss per source (train/source/LABEL/loss)", per_source))
    if "optim/lr" in curves:
        body.append(line_chart("learning rate (optim/lr)", [Series("optim/lr", *curves["optim/lr"])]))
    body.append(el("h2", "Spikes"))
    if why is not None:
        body.append(el("p", f"spikes not found: {why}", class_="error"))
    else:
        body.append(
            el(
                "p",
                f"A step is a spike when its train/loss is at least {answers.z:g} standard deviations above the mean "
                f"of the {answers.window} steps before it (olmo-data spikes): {len(spikes)} found.",
            )
        )
        if spikes and report.loss_record is None:
            body.append(
                el("p", "The save folder has no per-instance loss record: no instance can be named.", class_="note")
            )
    rows = []
    listed, pager = paged(spikes, page_number, SPIKES_PER_PAGE, "/")
    for s in listed:
        named = [
            el(
                "li",
                f"[{c.position}] instance {c.instance} ({c.source}): loss {number(c.loss)}, "
                f"{c.contribution:+.4f} to the step's loss",
                [join(" · ", el("a", d.id, href=href("/document", id=d.id))) for d in (c.documents or [])],
            )
            for c in s.contributors
        ]
        rows.append(
            el(
                "tr",
                el("td", el("a", f"step {s.step}", href=href(f"/step/{s.step}", sort="excess"), class_="spike-link")),
                el("td", _spike_note(s)),
                el("td", el("ol", named, class_="contributors") if named else "-"),
                data_step=s.step,
            )
        )
    if rows:
        head = el("tr", el("th", "step"), el("th", "loss"), el("th", "instances adding most"))
        body += [el("table", head, rows, class_="spikes"), pager]
    return page("Run", answers.name, *body, current="/")


def _fingerprint(view: StepView) -> Html:
    rebuilt = view.report.batch_fingerprint
    if view.logged_fingerprint is None:
        return el("p", f"batch fingerprint {rebuilt} (the run logged none for this step)", class_="fingerprint none")
    if view.logged_fingerprint == rebuilt:
        return el(
            "p", f"batch fingerprint {rebuilt}: the same as the run logged for this step ✓", class_="fingerprint ok"
        )
    return el(
        "p",
        f"batch fingerprint {rebuilt} rebuilt, but the run logged {view.logged_fingerprint}: this is not the batch it "
        "trained",
        class_="fingerprint bad",
    )


def _instance(answers: RunAnswers, view: StepView, i: Any) -> Html:
    head = [f"[{i.position}] instance {i.instance}", f" · source {i.source}" if i.source else ""]
    facts = [f"{i.path} @ token {i.token_offset}"]
    if i.supervised_tokens is not None:
        facts.append(f"loss {number(i.loss)} over {i.supervised_tokens} supervised tokens")
    if i.position in view.excess:
        facts.append(f"{view.excess[i.position]:+.4f} to the step's loss above the baseline")
    if i.masked:
        facts.append("masked by the instance filter (no token trained)")
    docs = [
        el(
            "li",
            el("a", d.id, href=href("/document", id=d.id)),
            f" from {d.src} line {d.loc}: instance tokens [{d.instance_start}, {d.instance_end}) = document tokens "
            f"[{d.document_start}, {d.document_start + d.instance_end - d.instance_start}) of {d.end - d.start}",
            class_=f"doc-{k % 2}",
        )
        for k, d in enumerate(i.documents or [])
    ]
    pieces = [
        el(
            "span",
            p.text,
            class_=" ".join(
                ["piece", f"doc-{p.document % 2}" if p.document is not None else "nodoc"]
                + ([] if p.supervised else ["masked"])
            ),
            title=None if p.supervised else "not trained on (label mask or instance filter)",
        )
        for p in answers.pieces(i)
    ]
    return el(
        "article",
        el("h3", head),
        el("p", " · ".join(facts), class_="meta"),
        el("ul", docs, class_="documents") if docs else el("p", "documents: no metadata beside the token file"),
        el("pre", pieces, class_="text"),
        class_="instance",
        id=f"position-{i.position}",
        data_position=i.position,
    )


def step_page(answers: RunAnswers, step: int, sort: str, page_number: int) -> bytes:
    view = answers.step(step)
    r = view.report
    sort = sort if sort in SORTS else ("excess" if view.excess else "position")
    if sort == "excess" and not view.excess:
        sort = "loss" if r.loss_record is not None else "position"
    if sort == "loss" and r.loss_record is None:
        sort = "position"
    instances = list(r.instances)
    if sort == "excess":
        instances.sort(key=lambda i: (-view.excess.get(i.position, -math.inf), i.position))
    elif sort == "loss":
        instances.sort(key=lambda i: (i.loss is None, -(i.loss or 0.0), i.position))
    shown, pager = paged(instances, page_number, PER_PAGE, f"/step/{step}", sort=sort)
    body: list[object] = [
        el(
            "p",
            f"step {r.step} = global batch {r.global_batch} (epoch {r.epoch}, batch {r.batch_in_epoch} of "
            f"{r.batches_per_epoch}); {r.global_batch_size} instances of {r.sequence_length} tokens, seed {r.seed}; "
            f"order {r.order_path}",
            class_="meta",
        ),
        el("p", f"data fingerprint {r.data_fingerprint}", class_="meta"),
        _fingerprint(view),
    ]
    if r.run_steps is not None and step > r.run_steps:
        body.append(
            el(
                "p",
                f"The run trains {r.run_steps} steps: this is the batch the order holds for step {step}, had it "
                "gone on.",
                class_="note",
            )
        )
    if view.spike is not None:
        body.append(el("p", f"A spike: {_spike_note(view.spike)}.", class_="spike-note"))
    if r.loss_record is None:
        body.append(el("p", "No per-instance losses for this step (no record, or it was not logged).", class_="note"))
    steps = [
        el("a", "← previous step", href=f"/step/{step - 1}") if step > 1 else None,
        el("a", "next step →", href=f"/step/{step + 1}"),
    ]
    orders = [
        el("a", f"by {s}", href=href(f"/step/{step}", sort=s), class_="current" if s == sort else None)
        for s in SORTS
        if s != "excess" or view.excess
        if s != "loss" or r.loss_record is not None
    ]
    body += [
        el("nav", steps, class_="steps"),
        el("nav", "order: ", orders, class_="sorts"),
        el(
            "p",
            "Text in grey with a dotted line was not trained on (label mask or instance filter).",
            class_="legend-note",
        ),
        pager,
        [_instance(answers, view, i) for i in shown],
        pager,
    ]
    return page(f"Step {step}", answers.name, *body)
