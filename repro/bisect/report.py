"""The bisection's reports, from its state (what bisect.json holds): report.md and a self-contained
report.html with every probe's counts and interval, where it ran, the decision trail, and for a
commit search the direction searched (a regression's first bad commit, or with --find-fix the first
good one) and the posterior plotted over the commits in history order. Everything shown from the probes (commit subjects, settings,
server messages) is escaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import matplotlib

from repro.bisect.direction import WORDS, Searched
from repro.cluster.node import describe
from repro.report.markdown import md_escape
from repro.report.model import fmt_pct, fmt_range
from repro.report.plots import Plot, encode_figure, subplots
from repro.stats.intervals import clopper_pearson

REPORT_HTML = "report.html"
REPORT_MD = "report.md"


def _rows(state: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for probe in state["probes"]:
        completed = probe["clean"] + probe["corrupt"]
        if completed:
            ci = clopper_pearson(probe["corrupt"], completed)
            rate = f"{fmt_pct(probe['corrupt'] / completed)} ({fmt_range(ci.low, ci.high)})"
        else:
            rate = "—"
        rows.append(
            {
                "number": str(probe["number"]),
                "target": probe["target"],
                "verdict": probe["verdict"],
                "counts": f"{probe['corrupt']}/{completed}",
                "rate": rate,
                "unfinished": f"{probe['timeout']} / {probe['error']}",
                "rounds": str(probe["rounds"]),
                "why": probe.get("why") or "",
                "note": probe.get("message") or "",
                "node": describe(probe.get("node")) or "—",  # a dash: a lost probe ran nowhere
            }
        )
    return rows


def posterior_plot(state: dict[str, Any]) -> Plot | None:
    """P(named commit = c) over the commits in history order after the last probe, the probed commits marked."""
    last = next((p["posterior"] for p in reversed(state["probes"]) if p.get("posterior")), None)
    if last is None:
        return None
    searched = Searched(state.get("direction", "regression"), len(last) - 1)
    culprit = searched.in_history(last[:-1])
    words = WORDS[searched.direction]
    with matplotlib.rc_context({"text.parse_math": False}):
        fig, ax = subplots((9, 3.2), top=0.45)  # room for the title
        ax.bar(range(len(culprit)), culprit, color="#c62828", width=0.8)
        probed = sorted({searched.history(p["index"]) for p in state["probes"] if p.get("index") is not None})
        ax.plot(probed, [-0.03] * len(probed), "^", color="#455a64", label="probed")
        ax.set_xlim(-0.5, len(culprit) - 0.5)
        ax.set_ylim(-0.06, 1.0)
        ax.set_xlabel(f"commit index (0 = the oldest, {words['old']} end; first-parent order)")
        ax.set_ylabel(words["probability"])
        ax.set_title(f"Posterior after {len(state['probes'])} probes; P(no culprit) = {last[-1]:.3f}")
        ax.legend(loc="upper left")
        data_uri = encode_figure(fig)
    named = "first bad one" if searched.direction == "regression" else "fixing one (the first good one)"
    return Plot("Posterior over the commits", f"Probability that each commit is the {named}", data_uri)


def _words(state: dict[str, Any]) -> dict[str, str]:
    return WORDS[state.get("direction", "regression")]


_HTML = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>repro bisect {{ s.kind }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left} .bad{color:#c62828;font-weight:bold}
.good{color:#2e7d32}.inconclusive,.lost{color:#8d6e63}.verdict{font-size:1.1em;background:#f5f5f5;padding:1em;border-left:4px solid #c62828}
</style></head><body>
<h1>repro bisect {{ s.kind }}</h1>
<p class="verdict">{{ s.conclusion }}</p>
<p>{{ s.probes | length }} probes, {{ s.sessions }} sessions. Status: {{ s.status }}.</p>
{% if s.get("searched") %}<p>Searched: {{ s.searched }}.</p>{% endif %}
{% if s.get("found") %}<h2>Result</h2><ul>{% for item in s.found %}<li><code>{{ item }}</code></li>{% endfor %}</ul>{% endif %}
{% if s.get("top") %}<h2>Likeliest culprits</h2><table><tr><th>commit</th><th>{{ words.probability }}</th></tr>
{% for t in s.top %}<tr><td><code>{{ t.label }}</code></td><td>{{ "%.3f" % t.probability }}</td></tr>{% endfor %}</table>{% endif %}
{% if plot %}<h2>{{ plot.title }}</h2><img src="{{ plot.data_uri }}" alt="{{ plot.alt }}">{% endif %}
<h2>Probes and decision trail</h2>
<table><tr><th>#</th><th>probed</th><th>why</th><th>verdict</th><th>corrupt/completed</th><th>rate (95% CI)</th>
<th>timeout / error</th><th>rounds</th><th>ran on</th><th>note</th></tr>
{% for r in rows %}<tr><td>{{ r.number }}</td><td><code>{{ r.target }}</code></td><td>{{ r.why }}</td>
<td class="{{ r.verdict }}">{{ r.verdict }}</td><td>{{ r.counts }}</td><td>{{ r.rate }}</td><td>{{ r.unfinished }}</td>
<td>{{ r.rounds }}</td><td>{{ r.node }}</td><td>{{ r.note }}</td></tr>{% endfor %}</table>
{% if s.get("changes") %}<h2>Settings that differ</h2><ol start="0">{% for c in s.changes %}<li><code>{{ c }}</code></li>{% endfor %}</ol>{% endif %}
</body></html>
"""
)


def render_markdown(state: dict[str, Any]) -> str:
    lines = [f"# repro bisect {state['kind']}", "", md_escape(state["conclusion"]), ""]
    lines.append(f"{len(state['probes'])} probes, {state['sessions']} sessions. Status: {state['status']}.")
    if state.get("searched"):
        lines += ["", f"Searched: {md_escape(state['searched'])}."]
    if state.get("found"):
        lines += ["", "## Result", "", *(f"- {md_escape(item)}" for item in state["found"])]
    if state.get("top"):
        lines += ["", "## Likeliest culprits", "", f"| commit | {_words(state)['probability']} |", "|---|---|"]
        lines += [f"| {md_escape(t['label'])} | {t['probability']:.3f} |" for t in state["top"]]
    lines += ["", "## Probes and decision trail", "",
              "| # | probed | why | verdict | corrupt/completed | rate (95% CI) | timeout / error | rounds | ran on | note |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in _rows(state):
        cells = [r["number"], md_escape(r["target"]), md_escape(r["why"]), r["verdict"], r["counts"], r["rate"],
                 r["unfinished"], r["rounds"], md_escape(r["node"]), md_escape(r["note"])]
        lines.append("| " + " | ".join(cells) + " |")
    if state.get("changes"):
        lines += ["", "## Settings that differ", "", *(f"{i}. {md_escape(c)}" for i, c in enumerate(state["changes"]))]
    return "\n".join(lines) + "\n"


def write_reports(path: Path, state: dict[str, Any]) -> tuple[Path, Path]:
    """Write report.md and report.html into the bisect directory."""
    md, html = Path(path) / REPORT_MD, Path(path) / REPORT_HTML
    md.write_text(render_markdown(state), encoding="utf-8")
    html.write_text(_HTML.render(s=state, rows=_rows(state), plot=posterior_plot(state), words=_words(state)),
                    encoding="utf-8")
    return md, html
