"""What `repro run` shows: a live view while it runs (or a progress line when not on a terminal) and a final table.

Only counts and numbers are shown live; anything that came from the model or the server is
escaped (`rich.markup.escape`) before it reaches the terminal.
"""

from __future__ import annotations

from pathlib import Path

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from repro.run.load import LoadProgress
from repro.store.exercise import fact_lines
from repro.store.loops import loop_line
from repro.store.records import Percentiles, RateEstimate, Summary

LIVE_REFRESH_PER_S = 4
PLAIN_EVERY_S = 5.0
LAG_WARNING_S = 0.050
"""Client event-loop lag (p99) above which the final view says the client distorted the timings."""


def say(console: Console, text: str) -> None:
    """One plain line: no markup, no highlighting, not wrapped (log readers grep for whole lines)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def progress_line(progress: LoadProgress) -> str:
    outcomes = progress.outcomes
    return (
        f"[{progress.elapsed_s:6.1f}s] finished {progress.finished}/{progress.planned}: "
        f"clean {outcomes['clean']}, corrupt {outcomes['corrupt']}, timeout {outcomes['timeout']}, "
        f"error {outcomes['error']}, wedged {progress.wedged}; in flight {progress.in_flight}; "
        f"{progress.turns} turns ({progress.turns_per_s:.1f}/s)"
        + (f"; stopping rule: {progress.stopping}" if progress.stopping else "")
    )


def _live_view(progress: LoadProgress) -> Table:
    caption = escape(f"stopping rule: {progress.stopping}") if progress.stopping else None
    table = Table(title="repro run", caption=caption, show_header=True, header_style="bold")
    for column in ("finished", "clean", "corrupt", "timeout", "error", "wedged", "in flight", "turns/s", "elapsed"):
        table.add_column(column, justify="right")
    outcomes = progress.outcomes
    table.add_row(
        f"{progress.finished}/{progress.planned}",
        f"[green]{outcomes['clean']}[/]",
        f"[red]{outcomes['corrupt']}[/]",
        f"[yellow]{outcomes['timeout']}[/]",
        f"[magenta]{outcomes['error']}[/]",
        str(progress.wedged),
        str(progress.in_flight),
        f"{progress.turns_per_s:.1f}",
        f"{progress.elapsed_s:.1f}s",
    )
    return table


async def show_progress(progress: LoadProgress, console: Console, live: bool) -> None:
    """Refresh the view until cancelled: a rich Live on a terminal, a plain line every few seconds otherwise."""
    if live and console.is_terminal:
        with Live(_live_view(progress), console=console, refresh_per_second=LIVE_REFRESH_PER_S, transient=True) as view:
            while True:
                await anyio.sleep(1 / LIVE_REFRESH_PER_S)
                view.update(_live_view(progress))
    while True:
        await anyio.sleep(PLAIN_EVERY_S)
        say(console, progress_line(progress))


_JUDGED = {"parsed": "the parsed message", "raw": "the raw text", "both": "the parsed message and the raw text"}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _rate_text(rate: RateEstimate) -> str:
    if rate.n == 0:
        return "no completed sessions"
    return (
        f"{rate.k}/{rate.n} = {_pct(rate.estimate)}  "
        f"[{_pct(rate.ci_low)}, {_pct(rate.ci_high)}] {rate.confidence:.0%} {rate.method}"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def final_view(summary: Summary, run_dir: Path) -> Group:
    counts = Table(title="Sessions", show_header=True, header_style="bold")
    for column in ("clean", "corrupt", "timeout", "error", "interrupted", "wedged", "total"):
        counts.add_column(column, justify="right")
    c = summary.counts
    counts.add_row(
        str(c.get("clean", 0)),
        str(c.get("corrupt", 0)),
        str(c.get("timeout", 0)),
        str(c.get("error", 0)),
        str(c.get("interrupted", 0)),
        str(summary.wedged),
        str(summary.sessions),
    )
    rates = Table(show_header=False, box=None)
    rates.add_column(style="bold")
    rates.add_column()
    rates.add_row("corruption rate (completed)", escape(_rate_text(summary.corruption_rate)))
    if summary.worst_case is not None and summary.best_case is not None and summary.counts.get("timeout", 0):
        rates.add_row("timeouts as corrupt", escape(_rate_text(summary.worst_case)))
        rates.add_row("timeouts as clean", escape(_rate_text(summary.best_case)))
    if summary.observe is not None:
        source = f" ({summary.raw_source})" if summary.raw_source else ""
        rates.add_row("judged", escape(_JUDGED.get(summary.observe, summary.observe) + source))
    if summary.loops is not None and summary.loops.turns:
        rates.add_row("loop signals", escape(loop_line(summary.loops)))
    if summary.parser_effect is not None:
        rates.add_row("hidden by the parser", escape(summary.parser_effect.describe()))
    if summary.stopping is not None:
        stop = summary.stopping
        rates.add_row("stopped", escape(f"{stop.decision} after {stop.sessions} of {stop.cap} sessions "
                                        f"({stop.looks} look{'s' if stop.looks != 1 else ''}): {stop.reason}"))
    if summary.exercised is not None:
        rates.add_row("server did", escape("; ".join(fact_lines(summary.exercised))))
        for feature in summary.exercised.features:
            style = {"exercised": "green", "not exercised": "yellow"}.get(feature.status, "")
            rates.add_row(f"[{style}]{feature.status}[/]" if style else feature.status, escape(feature.line))
    # A feature left idle was printed just above: the inconclusive row says only what else is thin.
    shown = {f.line for f in summary.exercised.features} if summary.exercised is not None else set()
    others = [reason for reason in summary.inconclusive_reasons if reason not in shown]
    if summary.inconclusive:
        rates.add_row("[yellow]inconclusive[/]", escape("; ".join(others) or "a feature was not exercised (above)"))
    lag = summary.loop_lag
    if lag is not None and lag.p99 is not None and lag.p99 > LAG_WARNING_S:
        rates.add_row(
            "[yellow]client overloaded[/]",
            f"event-loop lag p99 {1e3 * lag.p99:.0f} ms: latencies include the client's own delay",
        )
    latency = Table(title="Latency (s)", show_header=True, header_style="bold")
    for column in ("", "n", "p50", "p90", "p99", "max"):
        latency.add_column(column, justify="right")
    rows: list[tuple[str, Percentiles]] = list(summary.latency.items())
    if summary.loop_lag is not None:
        rows.append(("client loop lag", summary.loop_lag))
    rows += [(f"worker {index} loop lag", p) for index, p in enumerate(summary.worker_loop_lag)]
    for name, p in rows:
        latency.add_row(name, str(p.count), _seconds(p.p50), _seconds(p.p90), _seconds(p.p99), _seconds(p.max))
    footer = Text.assemble(
        (f"{summary.turns} turns in {summary.duration_s:.1f}s. ", ""),
        ("Run directory: ", "bold"),
        (str(run_dir), ""),
    )
    return Group(counts, rates, latency, footer)
