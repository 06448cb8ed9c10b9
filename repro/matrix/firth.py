"""Firth-penalised logistic regression of a matrix's corruption on its factor levels and their pairwise
products: coefficients, profile-likelihood intervals and likelihood-ratio p-values, or why a term could
not be estimated. Pure: counts in, terms out.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from repro.matrix.spec import MatrixSpec
from repro.store.records import OutcomeCounts


def finite(p: float | None) -> float | None:
    """A p-value that can enter a verdict: None for NaN or one outside [0, 1] (a test that could not be computed)."""
    return p if p is not None and math.isfinite(p) and 0.0 <= p <= 1.0 else None


def column_name(factor: str, level: str) -> str:
    """A design column's name: `factor=level`."""
    return f"{factor}={level}"


def _design_columns(
    spec: MatrixSpec, baseline: dict[str, str], interactions: bool
) -> list[tuple[str, Callable[[dict[str, str]], float]]]:
    mains = [
        (column_name(f, lv), (lambda levels, f=f, lv=lv: float(levels[f] == lv)))
        for f, factor in spec.factors.items()
        for lv in factor.levels
        if lv != baseline[f]
    ]
    columns = list(mains)
    if interactions:
        for (a, fa), (b, fb) in itertools.combinations(mains, 2):
            if a.split("=")[0] != b.split("=")[0]:
                columns.append((f"{a}×{b}", (lambda levels, fa=fa, fb=fb: fa(levels) * fb(levels))))
    return columns


@dataclass(frozen=True)
class FirthTerm:
    """One coefficient of the Firth fit; `p` is None, with the `reason` in words, when it could not be estimated."""

    coef: float | None
    low: float | None
    high: float | None
    p: float | None
    reason: str | None = None


def _firth_term(coef: float, low: float, high: float, p: float, converged: bool, iterations: int) -> FirthTerm:
    if not converged:
        return FirthTerm(None, None, None, None, f"the Firth fit did not converge in {iterations} iterations")
    values = [v if math.isfinite(v) else None for v in (coef, low, high)]
    if values[0] is None or finite(p) is None:
        # Penalised fits stay finite under plain separation; a NaN here means the likelihood is flat along
        # this term's direction: the events sit exactly where it and other terms are set together.
        return FirthTerm(
            None, None, None, None,
            "the Firth fit could not estimate this term (its likelihood-ratio test is undefined: the corruption "
            "is separated by the cells where this term is set, so the data cannot tell it from the terms it is made of)",
        )
    return FirthTerm(values[0], values[1], values[2], p)


def firth(
    spec: MatrixSpec, totals: dict[tuple[tuple[str, str], ...], OutcomeCounts], baseline: dict[str, str], interactions: bool
) -> dict[str, FirthTerm] | None:
    """Firth-penalised logistic regression of corruption (per completed session) on treatment-coded
    factor levels, and their pairwise products when `interactions`; None when the cells run cannot
    separate the terms (a half fraction aliases some interactions) or there is nothing to fit."""
    from firthmodels import (
        FirthLogisticRegression,  # slow to import (numba, sklearn): only when fitting
    )

    columns = _design_columns(spec, baseline, interactions)
    cells = [(dict(key), c) for key, c in totals.items() if c.completed > 0]
    if not cells or not columns:
        return None
    design = np.array([[fn(levels) for _, fn in columns] for levels, _ in cells])
    with_intercept = np.column_stack([design, np.ones(len(cells))])
    if np.linalg.matrix_rank(with_intercept) < with_intercept.shape[1]:
        return None
    events = sum(c.corrupt for _, c in cells)
    if events == 0 or events == sum(c.completed for _, c in cells):
        return None
    x = np.repeat(design, 2, axis=0)
    y = np.tile([1, 0], len(cells))
    weights = np.array([w for _, c in cells for w in (c.corrupt, c.clean)], dtype=float)
    max_iter = 100
    pvalues = np.full(len(columns), np.nan)
    intervals = np.full((len(columns), 2), np.nan)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        # The refits behind the likelihood-ratio tests and profile intervals constrain one term at a time;
        # near separation the constrained design goes singular and the library raises rather than
        # returning NaN. What could not be computed stays NaN and is reported as not estimable.
        try:
            model = FirthLogisticRegression(backend="numpy", max_iter=max_iter).fit(x, y, sample_weight=weights)
        except np.linalg.LinAlgError as exc:
            return {name: FirthTerm(None, None, None, None, f"the Firth fit failed: {exc}") for name, _ in columns}
        converged = bool(getattr(model, "converged_", True))
        if converged:
            for i in range(len(columns)):
                try:
                    model.lrt(i)
                    pvalues[i] = model.lrt_pvalues_[i]
                except np.linalg.LinAlgError:
                    pass
                try:
                    intervals[i] = model.conf_int(method="pl", features=i)[i]
                except np.linalg.LinAlgError:
                    pass
    return {
        name: _firth_term(
            float(model.coef_[i]), float(intervals[i][0]), float(intervals[i][1]), float(pvalues[i]), converged, max_iter
        )
        for i, (name, _) in enumerate(columns)
    }
