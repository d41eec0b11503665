"""HTML built so that nothing unescaped gets in: document text is untrusted web text.

Every page is made of `el(tag, *children, **attributes)`. A child that is a plain `str` is escaped; only `Html`
(what `el` and `join` return) passes as markup, so a `<script>` inside a document, a document id or a source path
always reaches the browser as text. Attribute values are always escaped, and links are built by `href` from fixed
routes and URL-quoted parameters, never taken from the data.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from urllib.parse import quote, urlencode

__all__ = ["Html", "el", "href", "join", "number", "page"]

_VOID = {"br", "hr", "input", "link", "meta", "img", "col"}
_ATTRIBUTE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")  # viewBox too


class Html(str):
    """Markup that is already safe: made by `el` or `join`, never from data."""


def _render(child: object) -> str:
    if child is None:
        return ""
    if isinstance(child, Html):
        return str(child)
    if isinstance(child, str):
        return html.escape(child, quote=False)
    if isinstance(child, (int, float)):
        return html.escape(str(child), quote=False)
    if isinstance(child, Iterable):
        return "".join(_render(c) for c in child)
    raise TypeError(f"cannot put a {type(child).__name__} into a page")


def join(*children: object) -> Html:
    """The children side by side, strings escaped."""
    return Html("".join(_render(c) for c in children))


def el(tag: str, *children: object, **attributes: object) -> Html:
    """<tag attributes>children</tag>. Attribute names come from the code (`class_` for class, `_` for `-`);
    values are escaped; False or None leaves an attribute out, True writes it bare."""
    attrs = []
    for key, value in attributes.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        if not name or set(name) - _ATTRIBUTE:
            raise ValueError(f"attribute name {key!r}")
        attrs.append(f" {name}" if value is True else f' {name}="{html.escape(str(value), quote=True)}"')
    opening = f"<{tag}{''.join(attrs)}>"
    if tag in _VOID:
        return Html(opening)
    return Html(f"{opening}{join(*children)}</{tag}>")


def href(route: str, fragment: str | None = None, **query: object) -> str:
    """A link to one of the view's own routes, its parameters URL-quoted (left out where None)."""
    if not route.startswith("/") or route.startswith("//"):
        raise ValueError(f"{route!r}: links go to the view's own routes")
    params = {k: str(v) for k, v in query.items() if v is not None}
    url = quote(route) + (f"?{urlencode(params)}" if params else "")
    return url + (f"#{quote(fragment)}" if fragment else "")


def number(value: float | int | None, digits: int = 4) -> str:
    """A value for a table: '-' where there is none, ints with thousands separators."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"


NAV = (("/", "Run"), ("/trace", "Trace"), ("/stages", "Stages and data"))


def page(title: str, run_name: str, *body: object, current: str = "") -> bytes:
    """A whole page: the stylesheet from the view's own assets, the navigation, `body`. No script anywhere."""
    nav = el(
        "nav",
        el("span", f"olmo-data view · {run_name}", class_="brand"),
        [el("a", label, href=route, class_="current" if route == current else None) for route, label in NAV],
    )
    doc = join(
        Html("<!DOCTYPE html>"),
        el(
            "html",
            el(
                "head",
                el("meta", charset="utf-8"),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("title", f"{title} · {run_name}"),
                el("link", rel="stylesheet", href="/static/view.css"),
            ),
            el("body", nav, el("main", el("h1", title), *body)),
            lang="en",
        ),
    )
    return doc.encode("utf-8")
