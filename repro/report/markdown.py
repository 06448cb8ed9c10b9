"""The Markdown summary: verdicts, the outcome table, comparisons and gate checks, sized for a GitHub job summary.

GitHub renders some inline HTML in job summaries, so every text that came from a run (names, rule ids,
gate lines) goes through `md_escape` first; it also replaces control characters, so a report.md printed
on a terminal cannot carry escape sequences.
"""

from __future__ import annotations

import re

from repro.store.loops import describe, loop_line
from repro.store.records import ParserEffect
from repro.report.model import ReportModel, clip, fmt_conf, fmt_pct, fmt_points, fmt_range
from repro.untrusted import printable

# Only what acts mid-line: emphasis, code, links, tables, strikethrough, @mentions and #issue links.
_SPECIAL = re.compile(r"([\\`*_\[\]|~@#])")
_ICON = {"corrupt": "🔴", "clean": "🟢", "inconclusive": "🟠"}


def md_escape(text: object) -> str:
    """Text safe in a Markdown table cell: no HTML, no Markdown syntax, no line breaks; bounded in length."""
    value = clip(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", printable(re.sub(r"\s+", " ", value)))


def _code(text: str) -> str:
    """A code span: nothing inside it is Markdown, so only backticks and line breaks must go."""
    return "`" + re.sub(r"[`\s]+", " ", clip(text)) + "`"


def _parser(parser: str | None) -> str:
    return f" (parser: {md_escape(parser)})" if parser else ""


def _effect(effect: ParserEffect | None, kind: str) -> str:
    """`hidden` or `made` sessions of the parser, over the sessions that verdict found corrupt."""
    if effect is None:
        return "—"
    if kind == "hidden":
        return f"{effect.hidden_sessions}/{effect.raw_corrupt_sessions} = {fmt_pct(effect.hidden_share)}"
    return f"{effect.made_sessions}/{effect.parsed_corrupt_sessions} = {fmt_pct(effect.made_share)}"


def render_markdown(model: ReportModel) -> str:
    conf = fmt_conf(model.confidence)
    lines = [f"## repro: {model.overall.upper()}: tool-call corruption report", ""]
    for run in model.runs:
        lines.append(f"{_ICON[run.verdict.kind]} **{md_escape(run.name)}**: {md_escape(run.verdict.headline)}")
        lines.extend(f"  - {md_escape(detail)}" for detail in run.verdict.details)
        lines.append("")
    lines += [
        f"| run | sessions | clean | corrupt | timeout | error | wedged | corruption rate | {conf} CI | upper bound "
        "| judged | parser hid | parser made |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for run in model.runs:
        c = run.counts
        lines.append(
            f"| {md_escape(run.name)} | {c.total} | {c.clean} | {c.corrupt} | {c.timeout} | {c.error} | {c.wedged} "
            f"| {c.corrupt}/{c.completed} = {fmt_pct(run.rate.estimate)} | {fmt_range(run.rate.low, run.rate.high)} "
            f"| {fmt_pct(run.upper)} | {run.observe}{_parser(run.parser)} | {_effect(run.effect, 'hidden')} | {_effect(run.effect, 'made')} |"
        )
    if model.comparisons:
        lines += [
            "",
            f"Against **{md_escape(model.comparisons[0].reference)}** (two-sided, Holm-adjusted):",
            "",
            "| run | rate | reference | difference | Boschloo p | Fisher p | Holm p |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in model.comparisons:
            r = row.result
            lines.append(
                f"| {md_escape(row.name)} | {row.k1}/{row.n1} | {row.k2}/{row.n2} "
                f"| {fmt_points(r.difference)} [{fmt_points(r.diff_low)}, {fmt_points(r.diff_high)}] "
                f"| {r.p_boschloo:.2g} | {r.p_fisher:.2g} | {row.p_holm:.2g} |"
            )
        lines += ["", f"Verdicts at a margin of ±{100 * model.margin:g} points (practically equivalent: the whole "
                  "difference interval within it), and the side channels:", ""]
        for row in model.comparisons:
            lines.append(f"- **{md_escape(row.name)}**: {md_escape(row.verdict_line)}")
            lines.extend(f"  - {md_escape(line)}" for line in row.side_lines)
    for run in model.runs:
        if run.stopping is not None:
            stop = run.stopping
            lines += ["", f"Stopping rule of **{md_escape(run.name)}**: {md_escape(stop.decision)} after "
                      f"{stop.sessions} of {stop.cap} sessions ({stop.looks} look{'s' if stop.looks != 1 else ''}): "
                      f"{md_escape(stop.reason)}"]
    for run in model.runs:
        checks = (run.gate or {}).get("checks")
        if isinstance(checks, list):
            lines += ["", f"Gate for **{md_escape(run.name)}**:", ""]
            lines.extend(f"- {md_escape(c.get('line', c))}" for c in checks if isinstance(c, dict))
    for run in model.runs:
        corrupt = run.corrupt_sessions
        if corrupt:
            rules = sorted({rule for s in corrupt for rule in s.rules})
            lines += ["", f"Corrupt sessions in **{md_escape(run.name)}**: "
                      f"{', '.join(str(s.session_id) for s in corrupt[:20])}{' …' if len(corrupt) > 20 else ''}; "
                      f"rules {', '.join(_code(r) for r in rules)}"]
    for run in model.runs:
        if run.loops.turns or run.control is not None:
            lines += ["", f"Loop signals of **{md_escape(run.name)}**: {loop_line(run.loops)}."]
            arms = run.control.arms if run.control is not None else []
            lines += [f"- {md_escape(line.strip())}" for arm in arms for line in describe(arm)]
    lines += ["", "The HTML report has the plots and the offending text of every corrupt session."]
    return "\n".join(lines) + "\n"
