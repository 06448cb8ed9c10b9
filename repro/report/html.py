"""The HTML report: one self-contained file from a jinja2 template with autoescaping on.

Model output reaches the page only through template variables, so it is always escaped; the page
carries no script and a Content-Security-Policy that forbids any.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jinja2
from markupsafe import Markup

from repro.store.exercise import FACT_WORDS, fmt_value
from repro.store.records import OUTCOMES
from repro.report.dsmlfont import font_face_css
from repro.report.model import ReportModel, clip, fmt_conf, fmt_pct, fmt_points

if TYPE_CHECKING:
    from repro.report.plots import Plot

MAX_DRILL = 50
"""Sessions shown in full per run and outcome; the rest are counted."""

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("repro.report", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
"""The packaged templates, autoescaped: every page that shows model or user text renders through it."""


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "∞"
    return f"{x:.3g}"


def _p(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.2g}"


def _secs(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} s"


TEMPLATES.filters.update(pct=fmt_pct, conf=fmt_conf, num=_num, p=_p, points=fmt_points, secs=_secs, clip=clip, fact=fmt_value)


def render_html(model: ReportModel, plots: list[Plot]) -> str:
    return TEMPLATES.get_template("report.html.j2").render(
        model=model, plots=plots, outcomes=OUTCOMES, max_drill=MAX_DRILL, fact_words=FACT_WORDS,
        dsml_font=Markup(font_face_css()),  # our own constant CSS, not model text
    )
