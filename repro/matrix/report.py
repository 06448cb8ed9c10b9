"""The matrix's reports: one self-contained HTML page (verdict, cell table, factor-effect chart with
intervals, links to each cell's run report), a Markdown summary and JUnit XML.

Reuses `repro.report`'s formatting, escaping, plot encoding and JUnit building; names from the spec
and messages from servers are untrusted text, escaped by jinja2's autoescape, `md_escape` and `xml_text`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import jinja2
import matplotlib

from repro.matrix.analysis import CellResult, CellRun, Effect, FactorChannels, MatrixAnalysis
from repro.matrix.sequential import summary_lines
from repro.report.junit import add_properties, junit_xml, xml_text
from repro.report.markdown import md_escape
from repro.report.model import fmt_pct, fmt_points, fmt_range
from repro.report.plots import Plot, encode_figure, label_inches, subplots
from repro.stats.sidechannels import ChannelTest, finding

HTML = "report.html"
MARKDOWN = "report.md"
JUNIT = "junit.xml"
RUN_REPORT = "report.html"


@dataclass(frozen=True)
class MatrixReport:
    html: Path
    markdown: Path
    junit: Path


def _p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 0.0001 else "<0.0001"


def _points(difference: float | None, low: float | None, high: float | None) -> str:
    if difference is None:
        return "—"
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    return fmt_points(difference) + interval


def _diff(effect: Effect) -> str:
    return _points(effect.difference, effect.diff_low, effect.diff_high)


def _conditional_diff(conditional: dict) -> str:
    """A widening's difference within the cause's level."""
    return _points(conditional.get("difference"), conditional.get("diff_low"), conditional.get("diff_high"))


def _signed(x: float) -> str:
    return f"{round(x, 2) + 0.0:+.2f}"  # + 0.0: a -0.004 reads +0.00, not -0.00


def _log_odds(effect: Effect) -> str:
    if effect.log_odds is None:
        return "—"
    bounds = (effect.log_odds_low, effect.log_odds_high)
    if None in bounds:  # the profile-likelihood interval did not close on one side
        return _signed(effect.log_odds) + " [" + ", ".join("—" if b is None else _signed(b) for b in bounds) + "]"
    return f"{_signed(effect.log_odds)} [{_signed(effect.log_odds_low)}, {_signed(effect.log_odds_high)}]"


def _at_baselines(analysis: MatrixAnalysis, effect: Effect) -> str:
    """Where a regression with interaction terms measures a main effect: the other factors at their
    baselines. Its log-odds is that comparison's, which the pooled difference beside it need not match,
    so the row shows the counts it rests on."""
    if not analysis.interactions or effect.log_odds is None or effect.factor not in analysis.baseline:
        return ""
    others = {f: lv for f, lv in analysis.baseline.items() if f != effect.factor}
    arms = {effect.level: [0, 0], effect.baseline: [0, 0]}
    for cell in analysis.cells:
        level = cell.levels.get(effect.factor)
        if level in arms and all(cell.levels.get(f) == lv for f, lv in others.items()):
            arms[level][0] += cell.counts.corrupt
            arms[level][1] += cell.counts.completed
    where = ", ".join(f"{f} {lv}" for f, lv in others.items())
    (kt, nt), (kr, nr) = arms[effect.level], arms[effect.baseline]
    return f"at {where}: {kt}/{nt} vs {kr}/{nr}"


def _rate(cell: CellResult) -> str:
    if cell.rate is None:
        return "—"
    return f"{fmt_pct(cell.rate)} ({fmt_range(cell.rate_low, cell.rate_high)})"


def effects_plot(effects: list[Effect]) -> Plot | None:
    """Each factor's corruption-rate difference (level minus baseline) with its 95% interval."""
    shown = [e for e in effects if e.difference is not None]
    if not shown:
        return None
    with matplotlib.rc_context({"text.parse_math": False}):
        labels = [f"{e.label} ({e.verdict})" for e in shown]
        fig, ax = subplots((7 + label_inches(labels), 0.6 * len(shown) + 1.4), left=label_inches(labels), top=0.45)
        for i, effect in enumerate(shown):
            colour = {"causes": "#c62828", "widens": "#ef6c00", "reduces": "#2e7d32"}.get(effect.verdict, "#455a64")
            low = effect.diff_low if effect.diff_low is not None else effect.difference
            high = effect.diff_high if effect.diff_high is not None else effect.difference
            ax.errorbar(
                [100 * effect.difference],
                [i],
                xerr=[[100 * (effect.difference - low)], [100 * (high - effect.difference)]],
                fmt="o",
                color=colour,
                capsize=4,
            )
        ax.axvline(0, color="#9e9e9e", linewidth=1)
        ax.set_yticks(range(len(shown)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("corruption rate difference, percentage points (95% interval)")
        ax.set_title("Factor effects on corruption")
        data_uri = encode_figure(fig)
    return Plot("Factor effects", "Corruption-rate difference per factor level with 95% intervals", data_uri)


_TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>repro matrix: {{ a.name }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right} td.l,th.l{text-align:left}
.causes{color:#c62828;font-weight:bold}.widens{color:#ef6c00;font-weight:bold}.reduces{color:#2e7d32}
.inconclusive{color:#8d6e63}.verdict{font-size:1.1em;background:#f5f5f5;padding:1em;border-left:4px solid #c62828}
</style></head><body>
<h1>repro matrix: {{ a.name }}</h1>
<p class="verdict">{{ a.verdict or "No verdict yet." }}</p>
<p>{{ a.runs.finished }} of {{ a.runs.planned }} runs finished{% if a.runs.failed %}, {{ a.runs.failed }} failed{% endif %};
alpha {{ a.alpha }}, {{ a.correction }}-adjusted. Baseline:
{% for f, lv in a.baseline.items() %}{{ f }}={{ lv }}{% if not loop.last %}, {% endif %}{% endfor %}.</p>
{% for note in a.notes %}<p><em>{{ note }}</em></p>{% endfor %}
{% if stopping %}<h2>Sequential design</h2><ul>{% for line in stopping %}<li>{{ line }}</li>{% endfor %}</ul>{% endif %}
<h2>Cells</h2>
<table><tr>{% for f in factors %}<th class="l">{{ f }}</th>{% endfor %}<th>runs</th><th>clean</th><th>corrupt</th>
<th>timeout</th><th>error</th><th>wedged</th><th>corruption rate (95% CI)</th><th class="l">cell caveats</th><th class="l">run reports</th></tr>
{% for c in a.cells %}<tr>{% for f in factors %}<td class="l">{{ c.levels[f] }}</td>{% endfor %}
<td>{{ c.runs }}{% if c.failed %} (+{{ c.failed }} failed){% endif %}</td><td>{{ c.counts.clean }}</td><td>{{ c.counts.corrupt }}</td>
<td>{{ c.counts.timeout }}</td><td>{{ c.counts.error }}</td><td>{{ c.counts.wedged }}</td><td>{{ rate(c) }}</td>
<td class="l">{{ c.reasons | join("; ") }}</td>
<td class="l">{% for d in c.run_dirs %}{% if d in reported %}<a href="{{ d }}/{{ run_report }}">{{ d.split("/")[-1] }}</a>{% else %}{{ d.split("/")[-1] }}{% endif %} {% endfor %}</td></tr>
{% endfor %}</table>
<p class="note">Each factor is judged on its levels' cells pooled (replicates included): the design's minimum of completed
sessions applies to those pooled arms, and a factor's notes say when one falls short. A cell's caveats are what the
tests take from that cell alone (its timeouts).</p>
{% if plot %}<h2>{{ plot.title }}</h2><img src="{{ plot.data_uri }}" alt="{{ plot.alt }}">{% endif %}
{% for title, rows in tables %}{% if rows %}
<h2>{{ title }}</h2>
<table><tr><th class="l">comparison</th><th class="l">verdict</th><th>level</th><th>baseline</th><th>difference [95% CI]</th>
<th>Firth log-odds [95% CI]{% if rows | map(attribute="log_odds") | reject("none") | list and rows[0].factor in a.baseline and a.interactions %}<br><small>other factors at baseline</small>{% endif %}</th><th>p</th><th>adjusted p</th><th class="l">test</th><th>power (10 pts)</th><th class="l">notes</th></tr>
{% for e in rows %}{% set c = e.conditional if e.widens else none %}<tr><td class="l">{{ e.label }}</td><td class="l {{ e.verdict.split()[0] }}">{{ e.verdict }}{% if e.widens %} ({{ c.within }}){% endif %}</td>
{% if c %}<td>{{ c.treated.k }}/{{ c.treated.n }}<br><small>all: {{ e.treated.k }}/{{ e.treated.n }}</small></td>
<td>{{ c.reference.k }}/{{ c.reference.n }}<br><small>all: {{ e.reference.k }}/{{ e.reference.n }}</small></td>
<td>{{ cdiff(c) }}<br><small>all: {{ diff(e) }}</small></td>
{% elif e.factor not in a.baseline %}<td>—</td><td>—</td><td>{{ diff(e) }}</td>{# an interaction: a regression term, no arms #}
{% else %}<td>{{ e.treated.k }}/{{ e.treated.n }}</td><td>{{ e.reference.k }}/{{ e.reference.n }}</td><td>{{ diff(e) }}</td>{% endif %}
{% set at = at_baselines(e) %}<td>{{ log_odds(e) }}{% if at %}<br><small>{{ at }}</small>{% endif %}</td>
<td>{{ p(c.p if c else e.p) }}</td><td>{{ p(c.p_adjusted if c else e.p_adjusted) }}</td><td class="l">{{ e.test }}</td>
<td>{{ "%.2f" % e.power if e.power is not none else "—" }}</td><td class="l">{{ e.reasons | join("; ") }}</td></tr>
{% endfor %}</table>{% endif %}{% endfor %}
{% if a.side_channels %}<h2>Side channels</h2>
<p>Each factor's level against its baseline on the finish_reason mix, output length and speculative acceptance (where
the server exports it), each arm's cells' sessions pooled; p-values Holm-adjusted over every channel of every
comparison. A channel that shifted while the corruption verdict did not move is marked "silent regression?": a lead
to look at, not a verdict.</p>
<table><tr><th class="l">comparison</th><th class="l">corruption</th><th class="l">channel</th><th class="l">level</th>
<th class="l">baseline</th><th class="l">test</th><th>Holm p</th><th class="l">finding</th></tr>
{% for s in a.side_channels %}{% for t in s.tests %}<tr><td class="l">{{ s.label }}</td><td class="l">{{ s.corruption }}</td>
<td class="l">{{ t.channel }}</td><td class="l">{{ t.arm1 }}</td><td class="l">{{ t.arm2 }}</td><td class="l">{{ t.test }}</td>
<td>{{ p(t.p_adjusted) }}</td><td class="l{% if t.shifted %} inconclusive{% endif %}">{{ channel_finding(s, t) }}</td></tr>
{% endfor %}{% endfor %}</table>{% endif %}
{% if failed %}<h2>Failed runs</h2>
<p>Excluded from the analysis: they did not measure the configuration asked for, or not to the end.
<code>--resume</code> reruns them.</p>
<ul>{% for r in failed %}<li>{{ r.key }}: {{ r.message }}</li>{% endfor %}</ul>{% endif %}
{% if placed %}<h2>Where runs ran</h2>
<p>A fault seen on one machine only is the machine's, not a feature's.</p>
<table><tr><th class="l">run</th><th class="l">status</th><th class="l">host</th><th class="l">Ray node</th></tr>
{% for r in placed %}<tr><td class="l">{{ r.key }}</td><td class="l">{{ r.status }}</td><td class="l">{{ r.node.hostname }}</td>
<td class="l">{{ r.node.get("ray_node_id") or "—" }}</td></tr>{% endfor %}</table>{% endif %}
{% if noted %}<h2>Notes on runs</h2><ul>{% for r in noted %}{% for note in r.notes %}
<li>{{ r.key }}: {{ note }}</li>{% endfor %}{% endfor %}</ul>{% endif %}
</body></html>
"""
)


def render_html(analysis: MatrixAnalysis, factors: list[str], runs: list[CellRun], reported: set[str]) -> str:
    """The page; `reported` holds the run directories (relative) that have their own report.html to link."""
    return _TEMPLATE.render(
        reported=reported,
        a=analysis,
        stopping=summary_lines(analysis.sequential) if analysis.sequential else [],
        factors=factors,
        plot=effects_plot(analysis.factors),
        tables=[
            ("Factors: corruption", analysis.factors),
            ("Two-factor interactions (Firth regression)", analysis.interactions),
            ("Factors: timeouts", analysis.timeouts),
            ("Factors: wedged streams", analysis.wedges),
        ],
        failed=[r for r in runs if r.status == "failed"],
        noted=[r for r in runs if getattr(r, "notes", None)],
        placed=sorted((r for r in runs if r.node), key=lambda r: r.order),
        run_report=RUN_REPORT,
        rate=_rate,
        diff=_diff,
        log_odds=_log_odds,
        at_baselines=lambda effect: _at_baselines(analysis, effect),
        cdiff=_conditional_diff,
        p=_p,
        channel_finding=channel_finding,
    )


def channel_finding(comparison: FactorChannels, test: ChannelTest) -> str:
    """One channel's finding in a word or three."""
    return finding(test, silent=test.channel in comparison.silent)


def render_markdown(analysis: MatrixAnalysis, factors: list[str], runs: list[CellRun] | None = None) -> str:
    lines = [f"## repro matrix: {md_escape(analysis.name)}", "", md_escape(analysis.verdict or "No verdict yet."), ""]
    lines.append("| " + " | ".join(md_escape(f) for f in factors) + " | clean | corrupt | timeout | error | rate |")
    lines.append("|" + "---|" * (len(factors) + 5))
    for cell in analysis.cells:
        c = cell.counts
        levels = " | ".join(md_escape(cell.levels[f]) for f in factors)
        lines.append(f"| {levels} | {c.clean} | {c.corrupt} | {c.timeout} | {c.error} | {md_escape(_rate(cell))} |")
    if analysis.factors:
        lines += ["", "| factor | verdict | level | baseline | difference | adjusted p |", "|---|---|---|---|---|---|"]
        for e in analysis.factors:
            treated, reference = f"{e.treated.k}/{e.treated.n}", f"{e.reference.k}/{e.reference.n}"
            diff, adjusted = _diff(e), _p(e.p_adjusted)
            verdict = e.verdict
            if e.widens and e.conditional:
                # The counts the verdict names (within the cause's level), then the pooled ones.
                c = e.conditional
                verdict = f"{e.verdict} ({c['within']})"
                treated = f"{c['treated']['k']}/{c['treated']['n']} (all: {treated})"
                reference = f"{c['reference']['k']}/{c['reference']['n']} (all: {reference})"
                diff, adjusted = f"{_conditional_diff(c)} (all: {diff})", _p(c["p_adjusted"])
            lines.append(f"| {md_escape(e.label)} | {md_escape(verdict)} | {treated} | {reference} | "
                         f"{md_escape(diff)} | {md_escape(adjusted)} |")
    if analysis.side_channels:
        lines += ["", "| side channel | comparison | corruption | level | baseline | Holm p | finding |",
                  "|---|---|---|---|---|---|---|"]
        for s in analysis.side_channels:
            for t in s.tests:
                lines.append(f"| {md_escape(t.channel)} | {md_escape(s.label)} | {md_escape(s.corruption)} | "
                             f"{md_escape(t.arm1)} | {md_escape(t.arm2)} | {md_escape(_p(t.p_adjusted))} | "
                             f"{md_escape(channel_finding(s, t))} |")
    if analysis.sequential:
        lines += ["", *(f"- {md_escape(line)}" for line in summary_lines(analysis.sequential))]
    failed = [r for r in runs or [] if r.status == "failed"]
    if failed:
        lines += ["", "Failed runs, excluded from the analysis (`--resume` reruns them):", ""]
        lines += [f"- {md_escape(r.key)}: {md_escape(r.message or 'no reason recorded')}" for r in failed]
    return "\n".join(lines) + "\n"


def render_junit(analysis: MatrixAnalysis) -> str:
    """A testcase per cell (failure when it corrupted) and per factor (failure when it causes or widens it)."""
    cases = []
    for cell in analysis.cells:
        case = ET.Element("testcase", classname=xml_text(f"repro.matrix.{analysis.name}"), name=xml_text(cell.name))
        c = cell.counts
        add_properties(case, {"clean": c.clean, "corrupt": c.corrupt, "timeout": c.timeout, "error": c.error,
                           "wedged": c.wedged, "corruption_rate": cell.rate})
        if c.corrupt:
            message = xml_text(f"{c.corrupt} of {c.completed} completed sessions corrupt")
            ET.SubElement(case, "failure", message=message, type="corrupt").text = message
        elif cell.inconclusive:
            ET.SubElement(case, "skipped", message=xml_text("; ".join(cell.reasons)))
        cases.append(case)
    for effect in analysis.factors:
        classname = xml_text(f"repro.matrix.{analysis.name}.factor")
        case = ET.Element("testcase", classname=classname, name=xml_text(effect.label))
        add_properties(case, {"verdict": effect.verdict, "p": effect.p, "p_adjusted": effect.p_adjusted,
                           "difference": effect.difference})
        if effect.verdict in ("causes", "widens"):
            message = xml_text(f"{effect.label} {effect.verdict} corruption (adjusted p {_p(effect.p_adjusted)})")
            ET.SubElement(case, "failure", message=message, type=effect.verdict).text = message
        elif effect.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=xml_text("; ".join(effect.reasons)))
        cases.append(case)
    return junit_xml(cases, suite=f"repro.matrix.{analysis.name}")


def write_reports(path: Path, analysis: MatrixAnalysis, factors: list[str], runs: list[CellRun]) -> MatrixReport:
    """Write report.html, report.md and junit.xml into the matrix directory."""
    root = Path(path)
    report = MatrixReport(root / HTML, root / MARKDOWN, root / JUNIT)
    reported = {d for cell in analysis.cells for d in cell.run_dirs if (root / d / RUN_REPORT).exists()}
    report.html.write_text(render_html(analysis, factors, runs, reported), encoding="utf-8")
    report.markdown.write_text(render_markdown(analysis, factors, runs), encoding="utf-8")
    report.junit.write_text(render_junit(analysis), encoding="utf-8")
    return report
