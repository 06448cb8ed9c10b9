"""The report's figures, drawn with matplotlib's Agg backend and inlined as base64 PNG data URIs.

PNG rather than SVG: an SVG inlined in the page carries text (run names, labels) as markup, a PNG
carries only pixels, so no label can ever become HTML. Figures are made on an Agg canvas directly,
without pyplot (its import and its global figure registry cost more than the drawing of a small
run's figures), with margins fixed in inches before drawing: a layout engine or a tight bounding box
draws each figure twice, and drawing is most of a small run's report.
"""

from __future__ import annotations

import base64
import io
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from repro.store.records import OUTCOMES
from repro.report.model import RunView

if TYPE_CHECKING:
    import pandas as pd

OUTCOME_COLOURS = {
    "clean": "#2e7d32",
    "corrupt": "#c62828",
    "timeout": "#ef6c00",
    "error": "#6a1b9a",
    "interrupted": "#757575",
}
# The race's signature is load-back traffic under load; a wedge shows as a flat transfer queue.
SERVER_PREFIXES = ("sglang:", "vllm:")
"""The servers' own metric namespaces: SGLang's and vLLM's."""
PREFERRED_METRICS = (
    "num_running_reqs",
    "num_requests_running",  # vLLM's name
    "num_queue_reqs",
    "num_requests_waiting",
    "prefix_cache_hits_total",
    "kv_cache_usage_perc",
    "load_back_tokens_total",
    "evicted_tokens_total",
    "num_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "cache_hit_rate",
    "token_usage",
    "gen_throughput",
)
MAX_METRICS = 4
MAX_LABEL = 40


@dataclass(frozen=True)
class Plot:
    title: str
    alt: str
    data_uri: str


def _short(name: str) -> str:
    return name if len(name) <= MAX_LABEL else name[: MAX_LABEL - 1] + "…"


CHAR_INCHES = 0.075
"""About the width of one character of a 10-point tick label, to leave room for the longest."""


def label_inches(labels: Sequence[str]) -> float:
    """The left margin (inches) that holds these tick labels and an axis label beside them."""
    return 0.35 + CHAR_INCHES * max((len(label) for label in labels), default=0)


def subplots(
    figsize: tuple[float, float],
    *args: Any,
    left: float = 0.8,
    bottom: float = 0.55,
    right: float = 0.25,
    top: float = 0.25,
    wspace: float = 0.25,
    hspace: float = 0.2,
    **kwargs: Any,
) -> tuple[Figure, Any]:
    """`Figure.subplots` on a figure of its own Agg canvas, margins (left…top) given in inches."""
    width, height = figsize
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=left / width, bottom=bottom / height, right=1 - right / width, top=1 - top / height,
                        wspace=wspace, hspace=hspace)
    return fig, fig.subplots(*args, **kwargs)


def encode_figure(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def outcomes_plot(runs: Sequence[RunView]) -> Plot:
    """Stacked outcome counts per run, beside the corruption rate with its interval."""
    labels = [_short(r.name) for r in runs]
    # Below the axes: the x labels, then the legend across the figure.
    fig, (left, right) = subplots((10, 1.6 + 0.5 * len(runs)), 1, 2, squeeze=True,
                                  left=label_inches(labels), bottom=0.95, wspace=0.08)
    y = np.arange(len(runs))
    offset = np.zeros(len(runs))
    for outcome in OUTCOMES:
        values = np.array([getattr(r.counts, outcome) for r in runs], dtype=float)
        if values.any():
            left.barh(y, values, left=offset, color=OUTCOME_COLOURS[outcome], label=outcome)
            offset += values
    left.set_yticks(y, labels)
    left.invert_yaxis()
    left.set_xlabel("sessions")
    left.legend(loc="lower center", bbox_to_anchor=(0.5, 0.02), bbox_transform=fig.transFigure, ncols=5, fontsize="small")
    for i, r in enumerate(runs):
        if r.rate.estimate is None:
            right.text(0.0, i, " no completed sessions", va="center", fontsize="small")
            continue
        right.errorbar(
            r.rate.estimate * 100, i,
            xerr=[[100 * (r.rate.estimate - r.rate.low)], [100 * (r.rate.high - r.rate.estimate)]],
            fmt="o", color=OUTCOME_COLOURS["corrupt"] if r.counts.corrupt else OUTCOME_COLOURS["clean"], capsize=4,
        )
    right.set_yticks(y, [""] * len(runs))
    right.set_ylim(left.get_ylim())
    right.set_xlim(left=0)
    right.set_xlabel(f"corruption rate over completed sessions, % ({runs[0].confidence:.0%} CI)")
    return Plot("Outcomes and corruption rate per run", "Outcome counts and corruption rate with intervals", encode_figure(fig))


def latency_plot(runs: Sequence[RunView]) -> Plot | None:
    """Empirical distributions (ECDF) of time to first token and end-to-end time over answered turns."""
    series = []
    for r in runs:
        turns = [t for s in r.run.sessions for t in s.turns]
        ttft = np.sort([t.ttft_s for t in turns if t.ttft_s is not None])
        e2e = np.sort([t.e2e_s for t in turns if t.e2e_s is not None])
        series.append((r, ttft, e2e))
    if not any(len(t) or len(e) for _, t, e in series):
        return None
    fig, axes = subplots((10, 3.4), 1, 2)
    for ax, index, what in ((axes[0], 1, "time to first token (s)"), (axes[1], 2, "end-to-end time per turn (s)")):
        for item in series:
            values = item[index]
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=_short(item[0].name))
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of turns")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="small", loc="lower right")
    return Plot("Latency distributions", "Cumulative distributions of TTFT and end-to-end time", encode_figure(fig))


def timeline_plot(run: RunView) -> Plot | None:
    """One bar per session from start to end, coloured by outcome, ticks at turn starts, wedges crossed."""
    sessions = sorted(run.run.sessions, key=lambda s: (s.start_s, s.session_id))
    if not sessions:
        return None
    height = min(14.0, 1.5 + 0.06 * len(sessions))
    fig, ax = subplots((10, height))
    # One collection, not one patch per session (barh): a 1000-session run draws in well under a second.
    bars = PolyCollection(
        [[(s.start_s, row - 0.4), (s.end_s, row - 0.4), (s.end_s, row + 0.4), (s.start_s, row + 0.4)]
         for row, s in enumerate(sessions)],
        facecolors=[OUTCOME_COLOURS[s.outcome] for s in sessions], edgecolors=[OUTCOME_COLOURS[s.outcome] for s in sessions],
        linewidths=0.3,
    )
    ax.add_collection(bars)
    ax.autoscale_view()
    ticks = [(t.start_s, row) for row, s in enumerate(sessions) for t in s.turns]
    if ticks:
        xs, ys = zip(*ticks)
        ax.plot(xs, ys, linestyle="none", marker="|", color="black", markersize=5)
    wedged = [(s.end_s, row) for row, s in enumerate(sessions) if s.wedged]
    if wedged:
        xs, ys = zip(*wedged)
        ax.plot(xs, ys, linestyle="none", marker="x", color="black", markersize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("session (by start time)")
    present = [o for o in OUTCOMES if any(s.outcome == o for s in sessions)]
    handles = [Line2D([0], [0], color=OUTCOME_COLOURS[o], lw=6, label=o) for o in present]
    handles.append(Line2D([0], [0], color="black", marker="|", linestyle="none", label="turn start"))
    if any(s.wedged for s in sessions):
        handles.append(Line2D([0], [0], color="black", marker="x", linestyle="none", label="wedged"))
    ax.legend(handles=handles, fontsize="small", loc="upper right")
    return Plot(f"Session timeline: {run.name}", "One bar per session coloured by outcome", encode_figure(fig))


def turn_index_plot(runs: Sequence[RunView]) -> Plot | None:
    """The share of answered turns judged corrupt, per turn index: does corruption grow with context?"""
    rows = [
        (position, t.index, t.verdict == "corrupt")
        for position, r in enumerate(runs)
        for s in r.run.sessions
        for t in s.turns
        if t.status == "ok"
    ]
    if not rows:
        return None
    answered = Counter((position, turn) for position, turn, _ in rows)
    corrupt = Counter((position, turn) for position, turn, bad in rows if bad)
    fig, ax = subplots((10, 3.2))
    width = 0.8 / len(runs)
    for position, r in enumerate(runs):
        turns = sorted(turn for run, turn in answered if run == position)
        counts = np.array([answered[position, turn] for turn in turns])
        hits = np.array([corrupt[position, turn] for turn in turns])
        x = np.array(turns, dtype=float) + (position - (len(runs) - 1) / 2) * width
        ax.bar(x, 100 * hits / counts, width=width, label=_short(r.name))
        for xi, k, n in zip(x, hits, counts):
            ax.annotate(f"{k}/{n}", (xi, 0), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("turn index")
    ax.set_ylabel("corrupt turns, % of answered")
    ax.legend(fontsize="small")
    return Plot("Corruption by turn index", "Share of answered turns judged corrupt at each turn index", encode_figure(fig))


SHARE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Cached-token share bins: a turn served mostly from cache is where a load-back can race."""
SIZE_BINS = 6


def _binned(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each value among `edges`: (e[i], e[i+1]], the first bin closed at its left edge."""
    return np.clip(np.searchsorted(edges, values, side="left") - 1, 0, len(edges) - 2)


def _rate_bars(ax: Any, values: np.ndarray, corrupt: np.ndarray, edges: np.ndarray, label: Callable[[float], str],
               *, between: str = "-") -> None:
    """Corrupt share of the turns in each non-empty bin of `values`, with k/n on each bar; `between` joins a
    bin's edges in its tick label."""
    bins = _binned(values, edges)
    shown = sorted(set(bins.tolist()))
    hits = [int(corrupt[bins == b].sum()) for b in shown]
    counts = [int((bins == b).sum()) for b in shown]
    x = range(len(shown))
    ax.bar(x, [100 * k / n for k, n in zip(hits, counts)], color=OUTCOME_COLOURS["corrupt"])
    for xi, k, n in zip(x, hits, counts):
        ax.annotate(f"{k}/{n}", (xi, 0), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(list(x), [f"{label(edges[b])}{between}{label(edges[b + 1])}" for b in shown], fontsize="small")
    ax.set_ylabel("corrupt turns, % of answered")


def turn_size_plot(runs: Sequence[RunView]) -> Plot | None:
    """The share of answered turns judged corrupt by prompt size (quantile bins) and by cached-token share."""
    rows = [(t.prompt_tokens, t.cached_tokens, t.verdict == "corrupt")
            for r in runs for s in r.run.sessions for t in s.turns if t.status == "ok" and t.prompt_tokens]
    if not rows:
        return None
    prompts = np.array([row[0] for row in rows], dtype=float)
    corrupt = np.array([row[2] for row in rows])
    # Room below the axes for two-line size labels and the axis title under them.
    fig, (by_size, by_share) = subplots((10, 3.4), 1, 2, squeeze=True, wspace=0.3, bottom=0.75)
    edges = np.unique(np.round(np.quantile(prompts, np.linspace(0, 1, SIZE_BINS + 1))))
    if len(edges) > 1:
        # Six "1,425-1,686" labels overrun half a 10-inch figure: each bin's edges go on two lines, in full
        # (rounded to thousands, narrow bins of long prompts read "10k-10k").
        _rate_bars(by_size, prompts, corrupt, edges, lambda v: f"{v:,.0f}", between="-\n")
    by_size.set_xlabel("prompt tokens")
    cached = [i for i, row in enumerate(rows) if row[1] is not None]
    if cached:
        shares = np.clip(np.array([rows[i][1] / rows[i][0] for i in cached]), 0, 1)
        _rate_bars(by_share, shares, corrupt[cached], np.array(SHARE_BINS), lambda v: f"{v:.0%}")
    by_share.set_xlabel("cached share of the prompt (usage.cached_tokens)")
    return Plot("Corruption by prompt size and by cached-token share",
                "Share of answered turns judged corrupt per prompt-size bin and per cached-token share bin",
                encode_figure(fig))


def metrics_plot(run: RunView, metrics: pd.DataFrame) -> Plot | None:
    """A few of the server's own series (sglang: or vllm:) over time (t_s, metric, labels, value), one panel per metric."""
    frame = metrics[metrics["metric"].astype(str).str.startswith(SERVER_PREFIXES)]
    if frame.empty:
        return None
    present = list(dict.fromkeys(frame["metric"].astype(str)))
    bare = {name.split(":", 1)[1]: name for name in present}
    chosen = [bare[m] for m in PREFERRED_METRICS if m in bare]
    # A configuration's *_info gauge is a constant 1: nothing to plot.
    chosen += [m for m in present if m not in chosen and not m.endswith(("_bucket", "_created", "_info"))]
    chosen = chosen[:MAX_METRICS]
    # The turns judged corrupt, on the metrics' time axis (both count from the start of the load).
    corrupt_starts = [t.start_s for s in run.run.sessions for t in s.turns if t.verdict == "corrupt"]
    fig, axes = subplots((10, 0.3 + 1.9 * len(chosen)), len(chosen), 1, sharex=True, squeeze=False, left=1.0)
    for ax, metric in zip(axes[:, 0], chosen):
        part = frame[frame["metric"] == metric]
        for labels, series in part.groupby(part["labels"].fillna("").astype(str), sort=True):
            series = series.sort_values("t_s")
            ax.plot(series["t_s"], series["value"], label=_short(labels) if labels else None)
        ax.set_ylabel(metric.split(":", 1)[1], fontsize="small")
        ax.grid(alpha=0.3)
        for start in corrupt_starts:
            ax.axvline(start, color=OUTCOME_COLOURS["corrupt"], alpha=0.35, linewidth=0.8)
    if corrupt_starts:
        axes[0, 0].legend(handles=[Line2D([0], [0], color=OUTCOME_COLOURS["corrupt"], label="corrupt turn sent")],
                          fontsize="small", loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run started")
    return Plot(f"Server metrics: {run.name}", "Server metrics over time", encode_figure(fig))
