"""`repro report`: run directories → one self-contained HTML report, plus Markdown and JUnit summaries.

Reads run directories only through `repro.store.rundir.load_run`; statistics come from `repro.stats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from repro.errors import UsageError
from repro.report.html import render_html
from repro.report.junit import render_junit
from repro.report.markdown import render_markdown
from repro.report.model import ReportModel, build_model
from repro.stats.equivalence import DEFAULT_MARGIN
from repro.store.rundir import _atomic_write as atomic_write
from repro.untrusted import scrub_surrogates
from repro.store.rundir import check_output

if TYPE_CHECKING:
    from repro.report.plots import Plot

__all__ = ["ReportResult", "render_report"]


@dataclass(frozen=True)
class ReportResult:
    html: Path
    markdown: Path | None
    junit: Path | None
    markdown_text: str
    """The Markdown summary, also when no file was asked for (the CLI sends it to $GITHUB_STEP_SUMMARY)."""
    model: ReportModel


def _plots(model: ReportModel) -> list[Plot]:
    # Imported here: matplotlib takes a while to load, and `repro gate` uses this package without drawing.
    import matplotlib

    from repro.report import plots

    # Run names and metric labels are data, not TeX: "$" must not switch matplotlib into mathtext.
    with matplotlib.rc_context({"text.parse_math": False}):
        drawn = [plots.outcomes_plot(model.runs), plots.latency_plot(model.runs)]
        drawn += [plots.timeline_plot(run) for run in model.runs]
        drawn.append(plots.turn_index_plot(model.runs))
        drawn.append(plots.turn_size_plot(model.runs))
        drawn += [plots.metrics_plot(run, run.metrics) for run in model.runs if run.metrics is not None]
    return [p for p in drawn if p is not None]


def _write(path: Path, text: str, what: str) -> None:
    """Write whole or not at all (a temporary file renamed over `path`), never a half or empty report."""
    try:
        # Model output may hold lone surrogates, which UTF-8 cannot encode: they become U+FFFD.
        atomic_write(Path(path), scrub_surrogates(text))
    except OSError as err:
        raise UsageError(f"{what} {path}: cannot write ({err.strerror or err})") from None


def render_report(
    run_dirs: Sequence[Path],
    output: Path,
    *,
    markdown: Path | None = None,
    junit: Path | None = None,
    confidence: float = 0.95,
    margin: float = DEFAULT_MARGIN,
) -> ReportResult:
    """Write the HTML report of one or more runs to `output` (and the Markdown and JUnit files when asked)."""
    if not run_dirs:
        raise UsageError("report: give at least one run directory")
    for option, path in (("--output", output), ("--markdown", markdown), ("--junit", junit)):
        if path is not None:
            check_output(path, run_dirs, option)
    model = build_model([Path(p) for p in run_dirs], confidence=confidence, margin=margin)
    _write(output, render_html(model, _plots(model)), "--output")
    markdown_text = render_markdown(model)
    if markdown is not None:
        _write(markdown, markdown_text, "--markdown")
    if junit is not None:
        _write(junit, render_junit(model), "--junit")
    return ReportResult(Path(output), markdown, junit, markdown_text, model)
