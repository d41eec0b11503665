"""Charts drawn on the server as inline SVG: curves over steps with marks that are links, and histograms.

No script draws them, so the page needs none (its Content-Security-Policy allows none); a mark's `<title>` is its
tooltip and its `<a>` opens the step it marks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from olmo_view.markup import Html, el

__all__ = ["Mark", "Series", "bars", "line_chart"]

WIDTH, HEIGHT = 860, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 30
MAX_POINTS = 2000  # points per polyline; longer series keep each bucket's first, min and max


@dataclass
class Series:
    label: str
    steps: Sequence[int]
    values: Sequence[float]


@dataclass
class Mark:
    """A point on the chart that opens a page: a spike and its step."""

    step: int
    value: float  # where to draw it (a non-finite one sits at the top)
    title: str
    link: str


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= raw:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step) + 1)]


def _thin(steps: Sequence[int], values: Sequence[float]) -> list[tuple[int, float]]:
    points = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 3))
    out: list[tuple[int, float]] = []
    for a in range(0, len(points), size):
        bucket = points[a : a + size]
        keep = {
            0,
            min(range(len(bucket)), key=lambda k: bucket[k][1]),
            max(range(len(bucket)), key=lambda k: bucket[k][1]),
        }
        out.extend(bucket[k] for k in sorted(keep))
    return out


def line_chart(title: str, series: Sequence[Series], marks: Sequence[Mark] = (), *, css_class: str = "chart") -> Html:
    """Curves over steps with their axes; each series its own colour (series-0, series-1, ... in the stylesheet),
    each mark a circle linking to its page."""
    drawn = [(s, _thin(s.steps, s.values)) for s in series]
    xs = [p[0] for _, pts in drawn for p in pts] + [m.step for m in marks]
    ys = [p[1] for _, pts in drawn for p in pts] + [m.value for m in marks if math.isfinite(m.value)]
    if not xs or not ys:
        return el("p", f"{title}: nothing logged", class_="empty")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or abs(y1) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (w * (step - x0) / (x1 - x0) if x1 > x0 else w / 2)

    def y(value: float) -> float:
        if not math.isfinite(value):
            return TOP
        return TOP + h - h * (value - y0) / (y1 - y0)

    parts = [el("rect", x=LEFT, y=TOP, width=w, height=h, class_="plot")]
    for t in _nice_ticks(y0, y1):
        parts.append(el("line", x1=LEFT, x2=LEFT + w, y1=f"{y(t):.1f}", y2=f"{y(t):.1f}", class_="grid"))
        parts.append(el("text", f"{t:.4g}", x=LEFT - 6, y=f"{y(t) + 4:.1f}", class_="ytick"))
    for t in _nice_ticks(x0, x1, 8):
        if t == int(t):
            parts.append(el("text", f"{int(t):,}", x=f"{x(t):.1f}", y=HEIGHT - 10, class_="xtick"))
    for k, (s, pts) in enumerate(drawn):
        coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        parts.append(el("polyline", el("title", s.label), points=coords, class_=f"line series-{k % 8}"))
    for m in marks:
        parts.append(
            el(
                "a",
                el("circle", el("title", m.title), cx=f"{x(m.step):.1f}", cy=f"{y(m.value):.1f}", r=6),
                href=m.link,
                class_="spike",
                data_step=m.step,
            )
        )
    legend = (
        el(
            "ul",
            [el("li", el("span", class_=f"swatch series-{k % 8}"), s.label) for k, (s, _) in enumerate(drawn)],
            class_="legend",
        )
        if len(series) > 1
        else None
    )
    svg = el(
        "svg",
        el("title", title),
        parts,
        viewBox=f"0 0 {WIDTH} {HEIGHT}",
        xmlns="http://www.w3.org/2000/svg",
        role="img",
        class_=css_class,
    )
    return el("figure", el("figcaption", title), svg, legend)


def bars(title: str, rows: Sequence[tuple[str, float]], *, unit: str = "", digits: int = 2) -> Html:
    """A horizontal bar per row (label, value), as long as its share of the largest."""
    if not rows:
        return el("p", f"{title}: nothing to show", class_="empty")
    top = max(v for _, v in rows) or 1.0
    height = 22 * len(rows) + 8
    label_w, bar_w = 170, WIDTH - 170 - 120
    parts = []
    for k, (label, value) in enumerate(rows):
        y0 = 4 + 22 * k
        shown = f"{value:,.{digits}f}{unit}"
        short = label if len(label) <= 24 else "…" + label[-23:]
        parts.append(el("text", el("title", label), short, x=label_w - 8, y=y0 + 14, class_="ytick"))
        parts.append(
            el(
                "rect",
                el("title", f"{label}: {shown}"),
                x=label_w,
                y=y0,
                height=16,
                width=f"{bar_w * value / top:.1f}",
                class_="bar",
            )
        )
        parts.append(el("text", shown, x=f"{label_w + bar_w * value / top + 6:.1f}", y=y0 + 14, class_="value"))
    svg = el(
        "svg",
        el("title", title),
        parts,
        viewBox=f"0 0 {WIDTH} {height}",
        xmlns="http://www.w3.org/2000/svg",
        role="img",
        class_="bars",
    )
    return el("figure", el("figcaption", title), svg)
