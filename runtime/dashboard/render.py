"""Turning page data into HTML: Jinja2 templates shipped in the package, Pygments for code, an SVG chart.

Autoescaping is on for every template; code is highlighted server-side (no JavaScript, no file from outside
the package); the chart is plain SVG geometry computed here.
"""

from __future__ import annotations

import functools
from datetime import datetime
from importlib import resources
from typing import Any, get_args

import jinja2
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from sandforge.runtime.agent.calllog import CallSource

_FORMATTER = HtmlFormatter(linenos="table", cssclass="highlight")
#: Output files the call page shows as images (an ``<img>`` only: an SVG's markup is never inlined; the file is
#: served inline only when its bytes are that image: ``runtime.files.media.shown_as_image``)
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg")


def image_file(name: str) -> bool:
    """Whether the call page shows this output as an image (by its name, as its media type was chosen)."""
    return name.lower().endswith(_IMAGE_SUFFIXES)


def code_html(code: str) -> Markup:
    """``code`` as highlighted HTML (Pygments escapes the text itself)."""
    return Markup(highlight(code, PythonLexer(), _FORMATTER))  # noqa: S704 (Pygments output, escaped by it)


def when(value: Any) -> str:
    """An RFC 3339 UTC timestamp as a short readable one (the JSON twin keeps the full value)."""
    if not value:
        return ""
    try:
        return datetime.fromisoformat(str(value)).strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        return str(value)


def chart(points: list[dict[str, Any]], width: int = 720, height: int = 160) -> dict[str, Any]:
    """Bar geometry for calls per hour, with their failures and, stacked on those, their answers with an error."""
    top = max((p["calls"] for p in points), default=0) or 1
    slot = width / max(1, len(points))
    bars = []
    for i, p in enumerate(points):
        h = round(p["calls"] / top * (height - 20), 1)
        fh = round(p["failures"] / top * (height - 20), 1)
        ah = round(p.get("answered", 0) / top * (height - 20), 1)
        bars.append({"x": round(i * slot + 1, 1), "w": round(slot - 2, 1), "h": h, "fh": fh, "ah": ah,
                     "y": round(height - h, 1), "fy": round(height - fh, 1), "ay": round(height - fh - ah, 1),
                     "label": when(p["hour"])[11:16], "calls": p["calls"], "failures": p["failures"],
                     "answered": p.get("answered", 0)})  # fmt: skip
    return {"width": width, "height": height, "top": top, "bars": bars}


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("sandforge.runtime.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = when
    env.globals["code_html"] = code_html
    env.globals["chart"] = chart
    env.globals["call_sources"] = get_args(CallSource)  # the calls page's source filter: every source there is
    env.globals["image_file"] = image_file
    return env


def page(template: str, **context: Any) -> str:
    defaults: dict[str, Any] = {"notice": None, "twin": None, "query": {}, "tenant": None, "nav": "", "csrf": ""}
    return environment().get_template(template).render(**(defaults | context))


@functools.cache
@functools.cache
def stylesheet() -> bytes:
    """The dashboard's CSS and Pygments' classes, in one file served from the package. Built once: it cannot
    change while the process runs, and a GET or HEAD of it then costs no file read and no style rendering."""
    own = resources.files("sandforge.runtime.dashboard").joinpath("static/dashboard.css").read_text("utf-8")
    defs: str = _FORMATTER.get_style_defs(".highlight")
    return (own + "\n" + defs).encode("utf-8")
