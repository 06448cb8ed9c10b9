"""sweep.md and sweep.html for `repro sweep`: the table per concurrency, the onset, and the curve as a PNG.

Run names and targets are user text: Markdown goes through `md_escape`, HTML through jinja2's
autoescaping, and the figure carries only pixels (repro.report.plots).
"""

from __future__ import annotations

from repro.cluster.node import describe
from repro.report.html import TEMPLATES
from repro.report.markdown import md_escape
from repro.sweep.analysis import SweepResult


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _interval(triple: tuple[float | None, float, float]) -> str:
    estimate, low, high = triple
    return f"{_pct(estimate)} [{_pct(low)}, {_pct(high)}]"


def _p(value: float | None) -> str:
    return "—" if value is None else f"{value:.2g}"


def curve_plot(result: SweepResult) -> str:
    """Corruption rate per level with its interval, and the fitted onset curve: a PNG data URI."""
    from repro.report.plots import encode_figure, subplots  # matplotlib: only when a curve is drawn

    fig, axis = subplots((7, 3.6))
    xs = [level.concurrency for level in result.levels]
    ys = [level.corruption[0] or 0.0 for level in result.levels]
    low = [y - level.corruption[1] for y, level in zip(ys, result.levels)]
    high = [level.corruption[2] - y for y, level in zip(ys, result.levels)]
    axis.errorbar(xs, ys, yerr=[low, high], fmt="o", color="#c62828", capsize=4,
                  label=f"corruption rate, {result.confidence:.0%} interval")
    timeouts = [level.timeouts[0] or 0.0 for level in result.levels]
    axis.plot(xs, timeouts, "s", color="#ef6c00", label="timeout share")
    if result.curve.points:
        axis.plot([p[0] for p in result.curve.points], [p[1] for p in result.curve.points], "-", color="#37474f",
                  label="Firth logistic fit on log2(concurrency)")
    if result.onset is not None:
        axis.axvline(result.onset, color="#6a1b9a", linestyle="--", label=f"onset ({result.onset})")
    axis.set_xscale("log", base=2)
    axis.set_xticks(xs, [str(x) for x in xs])
    axis.set_xlabel("concurrency")
    axis.set_ylabel("share of sessions")
    axis.set_ylim(0, max(0.05, *(level.corruption[2] for level in result.levels)) * 1.05)
    axis.legend(fontsize=8, loc="upper left")
    return encode_figure(fig)


def render_markdown(result: SweepResult) -> str:
    where = describe(result.node)
    lines = [
        f"# Concurrency sweep {md_escape(result.name)}",
        "",
        f"Target: {md_escape(result.target)}; {result.sessions_per_level} sessions per level; "
        f"{result.confidence:.0%} intervals." + (f" Ran on {md_escape(where)}." if where else ""),
        "",
        f"**{md_escape(result.conclusion)}**",
        "",
        "| concurrency | sessions | corrupt / completed | corruption rate | timeout share | p vs control | Holm p | above control |",
        "|---:|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for level in result.levels:
        lines.append(
            f"| {level.concurrency} | {level.sessions} | {level.corrupt}/{level.corrupt + level.clean} "
            f"| {_interval(level.corruption)} | {_interval(level.timeouts)} | {_p(level.p_vs_control)} "
            f"| {_p(level.p_holm)} | {'yes' if level.above_control else ''} |"
        )
    curve = result.curve
    lines.append("")
    if curve.slope is not None:
        lines.append(f"Onset curve (Firth logistic): logit(rate) = {curve.intercept:.2f} + {curve.slope:.2f} "
                     f"× log2(concurrency), slope interval [{curve.slope_low:.2f}, {curve.slope_high:.2f}], "
                     f"likelihood-ratio p = {_p(curve.p)}.")
    else:
        lines.append(md_escape(curve.note))
    return "\n".join(lines) + "\n"


def render_html(result: SweepResult) -> str:
    return TEMPLATES.get_template("sweep.html.j2").render(
        result=result, plot=curve_plot(result), interval=_interval, p=_p, where=describe(result.node),
    )
