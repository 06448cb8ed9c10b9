"""A sweep's analysis: each level's counts and intervals, the onset above the concurrency-1 control, and the
Firth logistic onset curve. Pure over finished run directories; the sweep runner and its reports read it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from repro.store.records import OutcomeCounts
from repro.store.rundir import load_run


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level: its counts, intervals, and its test against the control."""

    concurrency: int
    run_dir: str
    sessions: int
    clean: int
    corrupt: int
    timeout: int
    error: int
    corruption: tuple[float | None, float, float]
    """Rate over completed sessions, with its Clopper-Pearson interval."""
    timeouts: tuple[float | None, float, float]
    """Timed-out share of all sessions, with its interval."""
    p_vs_control: float | None = None
    p_holm: float | None = None
    above_control: bool = False


@dataclass(frozen=True)
class OnsetCurve:
    """Firth logistic fit: logit(rate) = intercept + slope * log2(concurrency)."""

    intercept: float | None
    slope: float | None
    slope_low: float | None
    slope_high: float | None
    p: float | None
    points: list[tuple[float, float]] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class SweepResult:
    """The whole sweep as sweep.json holds it."""

    name: str
    target: str
    confidence: float
    sessions_per_level: int
    levels: list[LevelResult]
    onset: int | None
    control_corrupt: bool
    curve: OnsetCurve
    conclusion: str
    started_at: str
    node: dict[str, str] = field(default_factory=dict)
    """Where the deployment and the load ran (repro.cluster.node): the host name, and `ray_node_id` on Ray."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _fit_curve(levels: Sequence[LevelResult], confidence: float) -> OnsetCurve:
    import warnings

    import numpy as np

    rows = [(math.log2(level.concurrency), level.corrupt, level.clean) for level in levels if level.corrupt + level.clean]
    events = sum(r[1] for r in rows)
    if not rows or events == 0 or events == sum(r[1] + r[2] for r in rows):
        return OnsetCurve(None, None, None, None, None, note="no curve: every completed session at every level "
                          + ("was clean" if events == 0 else "was corrupt"))
    from firthmodels import FirthLogisticRegression  # slow to import: only when fitting

    x = np.repeat(np.array([[r[0]] for r in rows]), 2, axis=0)
    y = np.tile([1, 0], len(rows))
    weights = np.array([w for r in rows for w in (r[1], r[2])], dtype=float)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            model = FirthLogisticRegression(backend="numpy", max_iter=100).fit(x, y, sample_weight=weights)
            model.lrt(0)
            p = float(model.lrt_pvalues_[0])
            low, high = (float(v) for v in model.conf_int(alpha=1 - confidence, method="pl", features=0)[0])
        except (np.linalg.LinAlgError, ValueError) as err:
            return OnsetCurve(None, None, None, None, None, note=f"no curve: the Firth fit failed ({err})")
    slope, intercept = float(model.coef_[0]), float(model.intercept_)
    top = max(level.concurrency for level in levels)
    grid = np.unique(np.round(np.geomspace(1, top, 40), 3))
    points = [(float(c), float(1 / (1 + math.exp(-(intercept + slope * math.log2(c)))))) for c in grid]
    return OnsetCurve(intercept, slope, low, high, None if math.isnan(p) else p, points)


def analyse(levels: list[LevelResult], *, confidence: float) -> tuple[list[LevelResult], int | None, OnsetCurve, str]:
    """Each level against the control (the lowest level, concurrency 1 when swept), Holm over the levels."""
    from repro.stats import compare, holm

    alpha = 1 - confidence
    control, rest = levels[0], levels[1:]
    tests = [compare(level.corrupt, level.corrupt + level.clean, control.corrupt, control.corrupt + control.clean,
                     alternative="greater").p_boschloo if level.corrupt + level.clean and control.corrupt + control.clean
             else 1.0 for level in rest]
    adjusted = holm(tests) if tests else []
    judged = [control] + [
        LevelResult(**{**asdict(level), "p_vs_control": p, "p_holm": q, "above_control": q < alpha})
        for level, p, q in zip(rest, tests, adjusted)
    ]
    onset = next((level.concurrency for level in judged[1:] if level.above_control), None)
    curve = _fit_curve(judged, confidence)
    rate = control.corruption[0] or 0.0
    base = f"concurrency {control.concurrency} (the control): {control.corrupt} of {control.corrupt + control.clean} corrupt"
    if onset is not None:
        conclusion = (f"onset at concurrency {onset}: the lowest level whose corruption rate is shown above the "
                      f"control's (Boschloo one-sided, Holm-adjusted, alpha {alpha:g}); {base}")
    elif control.corrupt:
        conclusion = (f"no onset: no level is shown above the control, which corrupts already ({100 * rate:.1f}%): "
                      f"the corruption does not depend on concurrency (a model habit or a single-request fault); {base}")
    else:
        conclusion = f"no onset: no level's corruption rate is shown above the control's; {base}"
    return judged, onset, curve, conclusion


def level_result(concurrency: int, run_dir: Path, confidence: float) -> LevelResult:
    """One finished level's counts and intervals, read back from its run directory."""
    from repro.stats import clopper_pearson  # scipy: only once a level has ended

    counts = OutcomeCounts.of(load_run(run_dir).sessions)
    judged = counts.clean + counts.corrupt + counts.timeout + counts.error
    rate = clopper_pearson(counts.corrupt, counts.completed, confidence)
    share = clopper_pearson(counts.timeout, judged, confidence)
    return LevelResult(
        concurrency=concurrency, run_dir=run_dir.name, sessions=judged, clean=counts.clean, corrupt=counts.corrupt,
        timeout=counts.timeout, error=counts.error, corruption=(rate.estimate, rate.low, rate.high),
        timeouts=(share.estimate, share.low, share.high),
    )
