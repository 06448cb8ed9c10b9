"""The matrix's statistics: per cell the rate and the inconclusive rule; per factor an exact test
stratified over the other factors, Firth logistic regression for main effects and two-factor
interactions, multiplicity-adjusted p-values, verdicts, and the verdict paragraph in plain words.

Pure functions over the per-run records of progress.jsonl; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from repro.matrix.design import Cell
from repro.matrix.exercise import idle_levels
from repro.matrix.firth import FirthTerm, column_name, finite, firth
from repro.matrix.spec import MatrixSpec, confirmed_value
from repro.stats import (
    assess_inconclusive,
    benjamini_hochberg,
    clopper_pearson,
    holm,
    newcombe_difference,
    power_two_proportions,
    stratified_exact_test,
)
from repro.stats.equivalence import bracket
from repro.stats.sidechannels import ChannelTest
from repro.store.records import OUTCOMES, OutcomeCounts

Verdict = Literal["causes", "widens", "reduces", "practically equivalent", "no detectable effect", "inconclusive",
                  "not exercised"]
"""`widens`: an effect only where a causing factor is on (bf16 index-K widening HiCache's race)."""


class CellRun(BaseModel):
    """One launch of one cell: a line of progress.jsonl, appended when the run ends."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    key: str
    cell: dict[str, str]
    replicate: int
    order: int
    status: Literal["finished", "failed"]
    counts: dict[str, int] = Field(default_factory=dict)
    wedged: int = 0
    run_dir: str | None = None
    """Relative to the matrix directory."""
    message: str | None = None
    """Why a failed run failed."""
    server_info: dict[str, Any] | None = None
    exercised: dict[str, float | None] = Field(default_factory=dict)
    """The run's exercise facts (summary.json's `exercised.facts`, None: unknown), for the factors' verdicts."""
    notes: list[str] = Field(default_factory=list)
    """What the report should say about this run: port holders that could not be verified, capped logs."""
    launch: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0
    node: dict[str, str] | None = None
    """Where the run ran (repro.cluster.node): hostname, and ray_node_id under the Ray executor."""


Outcome = Literal["corruption", "timeout", "wedge"]
TOGETHER = "acts only together with "
"""The reason of causes the data cannot rank: no corruption without each of them (more data may split them)."""

EVENTS: dict[str, Callable[[OutcomeCounts], tuple[int, int]]] = {
    # Corruption is judged over completed sessions only; a timeout proves neither clean nor corrupt.
    "corruption": lambda c: (c.corrupt, c.completed),
    "timeout": lambda c: (c.timeout, c.total),
    "wedge": lambda c: (c.wedged, c.total),
}


@dataclass
class CellResult:
    name: str
    levels: dict[str, str]
    runs: int
    failed: int
    counts: OutcomeCounts
    rate: float | None
    rate_low: float
    rate_high: float
    inconclusive: bool
    reasons: list[str]
    run_dirs: list[str]
    confirmed: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per process, the `/server_info` values of the keys the spec asked to confirm (first finished run)."""


@dataclass
class Arm:
    k: int
    n: int


@dataclass
class Effect:
    """One comparison (a factor's level against its baseline, or an interaction) for one outcome."""

    term: str
    factor: str
    level: str
    baseline: str
    label: str
    outcome: str
    treated: Arm
    reference: Arm
    test: str
    p: float | None
    p_adjusted: float | None = None
    difference: float | None = None
    diff_low: float | None = None
    diff_high: float | None = None
    log_odds: float | None = None
    log_odds_low: float | None = None
    log_odds_high: float | None = None
    firth_p: float | None = None
    power: float | None = None
    verdict: Verdict = "inconclusive"
    equivalence: dict[str, float] | None = None
    """The equivalence bracket of the difference (low, high) and the margin, where it was computed."""
    widens: str | None = None
    conditional: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)


MOVED = ("causes", "widens", "reduces")
"""Corruption verdicts that say the factor moved the corruption rate."""


@dataclass
class FactorChannels:
    """A factor's level against its baseline on the side channels: each arm's cells' sessions pooled
    (repro.matrix.sidechannels)."""

    factor: str
    level: str
    baseline: str
    label: str
    corruption: str
    """The factor's corruption verdict, as in `factors`."""
    tests: list[ChannelTest]
    """One per channel; `p_adjusted` is Holm's over every channel of every comparison in the matrix."""
    silent: list[str] = field(default_factory=list)
    """The channels that shifted while the corruption verdict did not move: "silent regression?"."""


@dataclass
class MatrixAnalysis:
    name: str
    alpha: float
    correction: str
    baseline: dict[str, str]
    cells: list[CellResult]
    factors: list[Effect]
    interactions: list[Effect]
    timeouts: list[Effect]
    wedges: list[Effect]
    verdict: str
    runs: dict[str, int]
    notes: list[str] = field(default_factory=list)
    sequential: dict[str, Any] | None = None
    """A sequential design's rounds, looks and what they spent (repro.matrix.sequential.SequentialRecord)."""
    side_channels: list[FactorChannels] = field(default_factory=list)
    """Each factor's arms compared on the finish_reason mix, output length and speculative acceptance."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cell_counts(runs: list[CellRun]) -> dict[tuple[tuple[str, str], ...], OutcomeCounts]:
    """Finished runs summed per cell (replicates pooled)."""
    found: dict[tuple[tuple[str, str], ...], OutcomeCounts] = {}
    for run in runs:
        if run.status != "finished":
            continue
        key = tuple(run.cell.items())
        c = run.counts
        counts = OutcomeCounts(**{outcome: c.get(outcome, 0) for outcome in OUTCOMES}, wedged=run.wedged)
        found[key] = found.get(key, OutcomeCounts()) + counts
    return found


def _cells(spec: MatrixSpec, runs: list[CellRun], order: list[tuple[tuple[str, str], ...]]) -> list[CellResult]:
    results = []
    totals = cell_counts(runs)
    for key in order:
        mine = [r for r in runs if tuple(r.cell.items()) == key]
        counts = totals.get(key, OutcomeCounts())
        rate = clopper_pearson(counts.corrupt, counts.completed)
        verdict = assess_inconclusive(
            counts.clean,
            counts.corrupt,
            counts.timeout,
            counts.error,
            # The factors' tests pool the cells of each level, and `min_completed` applies to those
            # pooled arms (_adequacy): a cell is held back only by what the tests take from it alone.
            min_completed=1,
            max_timeout_fraction=spec.design.max_timeout_fraction,
        )
        results.append(
            CellResult(
                name=Cell(key).name,
                levels=dict(key),
                runs=sum(r.status == "finished" for r in mine),
                failed=sum(r.status == "failed" for r in mine),
                counts=counts,
                rate=rate.estimate,
                rate_low=rate.low,
                rate_high=rate.high,
                inconclusive=verdict.inconclusive,
                reasons=list(verdict.reasons),
                run_dirs=[r.run_dir for r in mine if r.run_dir and r.status == "finished"],
                confirmed=next((_confirmed(r) for r in mine if r.status == "finished"), {}),
            )
        )
    return results


def _confirmed(run: CellRun) -> dict[str, dict[str, Any]]:
    infos = run.server_info or {}
    found = {}
    for process in run.launch.get("processes", []):
        info = infos.get(process["name"])
        if info is not None and process.get("expect"):
            found[process["name"]] = {key: confirmed_value(info, key)[1] for key in process["expect"]}
    return found


Table = tuple[int, int, int, int]


def _paired_arms(
    totals: dict[tuple[tuple[str, str], ...], OutcomeCounts],
    factor: str,
    level: str,
    baseline: str,
    where: dict[str, str] | None = None,
) -> list[tuple[OutcomeCounts, OutcomeCounts]]:
    """(treated, reference) counts per combination of the other factors, for those holding both arms."""
    arms: dict[tuple, dict[str, OutcomeCounts]] = {}
    for key, counts in totals.items():
        levels = dict(key)
        if levels[factor] not in (level, baseline):
            continue
        if where and any(levels[f] != lv for f, lv in where.items()):
            continue
        stratum = tuple((f, lv) for f, lv in key if f != factor)
        side = "t" if levels[factor] == level else "r"
        arms.setdefault(stratum, {})[side] = arms.get(stratum, {}).get(side, OutcomeCounts()) + counts
    return [(sides["t"], sides["r"]) for sides in arms.values() if "t" in sides and "r" in sides]


def _strata(
    totals: dict[tuple[tuple[str, str], ...], OutcomeCounts],
    factor: str,
    level: str,
    baseline: str,
    event: Callable[[OutcomeCounts], tuple[int, int]],
    where: dict[str, str] | None = None,
    worst_case: bool = False,
) -> tuple[list[Table], Arm, Arm]:
    """One 2x2 table (events and non-events, treated then reference) per combination of the other
    factors, only for strata that hold both arms; also the pooled arms over those strata.
    `worst_case` is the censoring least kind to a claim that the treated level raises the event rate:
    the treated arm's timeouts count as non-events, the reference arm's as events."""
    tables: list[Table] = []
    treated, reference = Arm(0, 0), Arm(0, 0)
    for t, r in _paired_arms(totals, factor, level, baseline, where):
        kt, nt = event(t)
        kr, nr = event(r)
        if worst_case:
            nt += t.timeout
            kr, nr = kr + r.timeout, nr + r.timeout
        if nt == 0 or nr == 0:
            continue
        tables.append((kt, nt - kt, kr, nr - kr))
        treated = Arm(treated.k + kt, treated.n + nt)
        reference = Arm(reference.k + kr, reference.n + nr)
    return tables, treated, reference


def _stratified_p(tables: list[Table]) -> float | None:
    if not tables:
        return None
    if sum(t[0] + t[2] for t in tables) == 0:
        return 1.0
    return finite(float(stratified_exact_test(tables).p_value))


def _adjust(pvalues: list[float | None], correction: str) -> list[float | None]:
    present = [p for p in pvalues if p is not None]
    if len(present) <= 1:
        adjusted = present
    elif correction == "holm":
        adjusted = holm(present)
    elif correction == "fdr_bh":
        adjusted = benjamini_hochberg(present)
    else:
        adjusted = present
    it = iter(adjusted)
    return [next(it) if p is not None else None for p in pvalues]


def _comparisons(spec: MatrixSpec, baseline: dict[str, str]) -> list[tuple[str, str, str]]:
    return [(f, lv, baseline[f]) for f, factor in spec.factors.items() for lv in factor.levels if lv != baseline[f]]


def _label(spec: MatrixSpec, factor: str, level: str, baseline: str) -> str:
    return f"{spec.label(factor)} {level} vs {baseline}"


def _effect(
    spec: MatrixSpec,
    totals: dict[tuple[tuple[str, str], ...], OutcomeCounts],
    comparison: tuple[str, str, str],
    outcome: Outcome,
    fitted: dict[str, FirthTerm] | None,
    where: dict[str, str] | None = None,
) -> Effect:
    factor, level, base = comparison
    tables, treated, reference = _strata(totals, factor, level, base, EVENTS[outcome], where)
    p = _stratified_p(tables)
    test = "stratified exact"
    term = column_name(factor, level)
    firth_term = fitted.get(term) if fitted else None
    if firth_term is not None and firth_term.p is None:
        firth_term = None  # nothing to report from the regression; the exact test stands alone
    if p is None and firth_term is not None:
        # No stratum holds both arms (a fractional design): the regression is the only comparison.
        p, test = firth_term.p, "Firth likelihood ratio"
        treated = Arm(*EVENTS[outcome](_arm_totals(totals, factor, level)))
        reference = Arm(*EVENTS[outcome](_arm_totals(totals, factor, base)))
    effect = Effect(
        term=term,
        factor=factor,
        level=level,
        baseline=base,
        label=_label(spec, factor, level, base),
        outcome=outcome,
        treated=treated,
        reference=reference,
        test=test,
        p=p,
    )
    if treated.n and reference.n:
        effect.difference = treated.k / treated.n - reference.k / reference.n
        effect.diff_low, effect.diff_high = newcombe_difference(treated.k, treated.n, reference.k, reference.n)
    if firth_term is not None:
        effect.log_odds, effect.log_odds_low = firth_term.coef, firth_term.low
        effect.log_odds_high, effect.firth_p = firth_term.high, firth_term.p
    return effect


def _significant(effect: Effect, alpha: float) -> bool:
    return effect.p_adjusted is not None and effect.p_adjusted < alpha


def _direction(effect: Effect) -> float:
    if effect.difference is not None:
        return effect.difference
    if effect.log_odds is not None:
        return effect.log_odds
    return 0.0


def _arm_totals(totals: dict[tuple[tuple[str, str], ...], OutcomeCounts], factor: str, level: str) -> OutcomeCounts:
    found = OutcomeCounts()
    for key, counts in totals.items():
        if dict(key)[factor] == level:
            found = found + counts
    return found


def _adequacy(spec: MatrixSpec, totals: dict[tuple[tuple[str, str], ...], OutcomeCounts], effect: Effect) -> list[str]:
    """Why the arms of a non-significant comparison cannot support "no detectable effect"."""
    reasons = []
    design = spec.design
    for level in (effect.level, effect.baseline):
        arm = _arm_totals(totals, effect.factor, level)
        name = f"{spec.label(effect.factor)} {level}"
        if arm.completed < design.min_completed:
            reasons.append(f"{name}: only {arm.completed} sessions completed (minimum {design.min_completed})")
        if arm.total and arm.timeout / arm.total > design.max_timeout_fraction:
            reasons.append(f"{name}: {arm.timeout} of {arm.total} sessions timed out")
    return reasons


def _power(spec: MatrixSpec, treated: Arm, reference: Arm) -> float | None:
    if not treated.n or not reference.n:
        return None
    base = reference.k / reference.n
    target = min(1.0, base + spec.design.detect)
    return power_two_proportions(target, base, treated.n, reference.n, alpha=spec.design.alpha, test="fisher")


def _judge_corruption(spec: MatrixSpec, totals: dict, effects: list[Effect]) -> None:
    """Verdicts for the factors' corruption effects: causes, widens, reduces, no detectable effect, inconclusive.

    Only a significant positive effect can make a factor "causes" or "widens". Among those, a factor
    causes corruption when its effect holds alone (every other significant factor at its baseline) or
    when no cell with the factor at its baseline corrupted at all (corruption needs it); a factor whose
    baseline cells corrupted too, and that raises corruption within a cause's strata, widens it.
    """
    alpha, correction = spec.design.alpha, spec.design.correction
    for effect, adjusted in zip(effects, _adjust([e.p for e in effects], correction)):
        effect.p_adjusted = adjusted
    positive = [e for e in effects if _significant(e, alpha) and _direction(e) > 0]
    alone_p = []
    for effect in positive:
        where = {o.factor: o.baseline for o in positive if o.factor != effect.factor}
        if not where:
            alone_p.append(effect.p)
            continue
        alone = _effect(spec, totals, (effect.factor, effect.level, effect.baseline), "corruption", None, where)
        alone_p.append(alone.p if alone.difference is not None and alone.difference > 0 else 1.0)
    causes: list[Effect] = []
    # Causes whose effect did not hold alone: corruption needed each of them, so they act together.
    needed: list[Effect] = []
    for effect, p in zip(positive, _adjust(alone_p, correction)):
        at_baseline = _arm_totals(totals, effect.factor, effect.baseline)
        if p is not None and p < alpha:
            causes.append(effect)
        elif at_baseline.corrupt == 0:
            causes.append(effect)
            needed.append(effect)
            effect.reasons.append(
                f"no corruption in any cell with {spec.label(effect.factor)} {effect.baseline} "
                f"(0/{at_baseline.completed})"
            )
    for effect in needed:
        others = [f"{spec.label(o.factor)} {o.level}" for o in needed if o is not effect]
        if others:
            effect.reasons.append(TOGETHER + ", ".join(others))
    for effect in causes:
        caveat = _censoring_caveat(spec, totals, effect, None, tests=len(effects))
        if caveat:
            effect.verdict = "inconclusive"
            effect.reasons.append(caveat)
        else:
            effect.verdict = "causes"
    confirmed = [e for e in causes if e.verdict == "causes"]
    _judge_widening(spec, totals, [e for e in effects if e not in causes], confirmed)
    for effect in effects:
        if effect in causes or effect.verdict == "widens":
            continue
        if _significant(effect, alpha) and _direction(effect) < 0:
            effect.verdict = "reduces"
        elif effect in positive:
            effect.reasons.append("significant overall, but neither alone nor within a causing factor's strata")
        elif effect.p is None:
            effect.reasons.append("no stratum holds both levels and the regression could not be fitted")
        else:
            effect.power = _power(spec, effect.treated, effect.reference)
            effect.reasons += _adequacy(spec, totals, effect)  # after any censoring caveat of the widening test
            effect.verdict = "inconclusive" if effect.reasons else "no detectable effect"
            if _equivalent(spec, totals, effect, tests=len(effects)):
                effect.verdict = "practically equivalent"


def _equivalent(spec: MatrixSpec, totals: dict, effect: Effect, *, tests: int) -> bool:
    """Does the whole difference between the factor's arms lie within ±design.margin? TOST at alpha / tests
    (Bonferroni over the factors), timeouts counted as the worst case (repro.stats.equivalence.bracket);
    `equivalence` on the effect keeps the bracket."""
    treated = _arm_totals(totals, effect.factor, effect.level)
    reference = _arm_totals(totals, effect.factor, effect.baseline)
    if not treated.completed or not reference.completed:
        return False
    low, high = bracket(treated.corrupt, treated.completed, reference.corrupt, reference.completed,
                        timeout1=treated.timeout, timeout2=reference.timeout,
                        confidence=1 - spec.design.alpha / max(1, tests))
    effect.equivalence = {"low": low, "high": high, "margin": spec.design.margin}
    return -spec.design.margin < low and high < spec.design.margin


def _censoring_caveat(
    spec: MatrixSpec, totals: dict, effect: Effect, where: dict[str, str] | None, *, tests: int
) -> str | None:
    """Why a significant rise in corruption may be the timeouts' doing, or None when it survives them.

    A timed-out session's corruption is unknown. The rise stands only if it is still significant
    (Bonferroni over `tests`) with the treated arm's timeouts counted clean and the reference's corrupt.
    """
    comparison = (effect.factor, effect.level, effect.baseline)
    # The timeouts of the strata the worst-case test compares (those with sessions on both sides).
    pairs = [
        (t, r) for t, r in _paired_arms(totals, *comparison, where)
        if t.completed + t.timeout and r.completed + r.timeout
    ]
    treated_timeouts, reference_timeouts = sum(t.timeout for t, _ in pairs), sum(r.timeout for _, r in pairs)
    tables, worst_treated, worst_reference = _strata(totals, *comparison, EVENTS["corruption"], where, worst_case=True)
    if not (treated_timeouts or reference_timeouts):
        return None
    worst = _stratified_p(tables)
    if (
        worst is not None
        and worst * tests < spec.design.alpha
        and worst_treated.k * worst_reference.n > worst_reference.k * worst_treated.n
    ):
        return None
    name = spec.label(effect.factor)
    parts = []
    if treated_timeouts:
        parts.append(f"the {treated_timeouts} timeouts with {name} {effect.level} had been clean")
    if reference_timeouts:
        noun = "" if parts else " timeouts"
        parts.append(f"the {reference_timeouts}{noun} with {name} {effect.baseline} {'' if parts else 'had been '}corrupt")
    within = f" (with {', '.join(f'{spec.label(f)} {lv}' for f, lv in where.items())})" if where else ""
    return f"not significant{within} if " + " and ".join(parts)


def _judge_widening(spec: MatrixSpec, totals: dict, candidates: list[Effect], causes: list[Effect]) -> None:
    """A factor "widens" a cause when it raises corruption within the cause's strata (an amplifier)."""
    tests: list[tuple[Effect, Effect, Effect]] = []
    for effect in candidates:
        for cause in causes:
            if cause.factor == effect.factor:
                continue
            comparison = (effect.factor, effect.level, effect.baseline)
            within = _effect(spec, totals, comparison, "corruption", None, {cause.factor: cause.level})
            if within.p is not None:
                tests.append((effect, cause, within))
    adjusted = _adjust([within.p for _, _, within in tests], spec.design.correction)
    for (effect, cause, within), p in zip(tests, adjusted):
        if effect.verdict == "widens" or p is None or p >= spec.design.alpha or _direction(within) <= 0:
            continue
        caveat = _censoring_caveat(spec, totals, effect, {cause.factor: cause.level}, tests=len(tests))
        if caveat:
            effect.reasons.append(caveat)
            continue
        effect.verdict = "widens"
        effect.widens = cause.factor
        effect.conditional = {
            "within": f"{spec.label(cause.factor)} {cause.level}",
            "treated": asdict(within.treated),
            "reference": asdict(within.reference),
            "p": within.p,
            "p_adjusted": p,
            "difference": within.difference,
            "diff_low": within.diff_low,
            "diff_high": within.diff_high,
        }


def _judge_exercise(spec: MatrixSpec, runs: list[CellRun], effects: list[Effect]) -> None:
    """A "no detectable effect" of a level that never acted becomes "not exercised", with the reason."""
    idle = idle_levels(spec, runs)
    for effect in effects:
        why = idle.get((effect.factor, effect.level))
        if why is not None and effect.verdict in ("no detectable effect", "practically equivalent", "inconclusive"):
            effect.verdict = "not exercised"
            effect.reasons.append(why)


def _judge_secondary(spec: MatrixSpec, effects: list[Effect]) -> None:
    for effect, adjusted in zip(effects, _adjust([e.p for e in effects], spec.design.correction)):
        effect.p_adjusted = adjusted
        if effect.p is None:
            effect.verdict = "inconclusive"
            effect.reasons.append(effect.reasons.pop() if effect.reasons else "no stratum holds both levels")
            effect.reasons.append(f"left out of the {spec.design.correction} adjustment")
        elif _significant(effect, spec.design.alpha):
            effect.verdict = "causes" if _direction(effect) > 0 else "reduces"
        else:
            effect.power = _power(spec, effect.treated, effect.reference)
            effect.verdict = "no detectable effect"


def _interactions(
    spec: MatrixSpec, fitted: dict[str, FirthTerm] | None, baseline: dict[str, str],
    totals: dict[tuple[tuple[str, str], ...], OutcomeCounts],
) -> list[Effect]:
    if not fitted:
        return []
    effects = []
    for term, value in fitted.items():
        if "×" not in term:
            continue
        a, b = term.split("×")
        (fa, la), (fb, lb) = a.split("=", 1), b.split("=", 1)
        effects.append(
            Effect(
                term=term,
                factor=f"{fa}×{fb}",
                level=f"{la}×{lb}",
                baseline=f"{baseline[fa]}×{baseline[fb]}",
                label=f"{spec.label(fa)} {la} × {spec.label(fb)} {lb}",
                outcome="corruption",
                treated=Arm(0, 0),
                reference=Arm(0, 0),
                test="Firth likelihood ratio",
                p=value.p,
                log_odds=value.coef,
                log_odds_low=value.low,
                log_odds_high=value.high,
                firth_p=value.p,
                reasons=[value.reason] if value.reason else [],
            )
        )
    _judge_secondary(spec, effects)  # the sign is the log-odds'
    for effect in effects:
        if effect.verdict == "no detectable effect":
            # An interaction is a difference of effects; detecting it takes at least what detecting the
            # second factor's effect within the first's level takes, so that power bounds it from above.
            # Only that comparison's arms are needed: the interaction's own test is the regression's.
            (fa, la), (fb, lb) = (part.split("=", 1) for part in effect.term.split("×"))
            _, treated, reference = _strata(totals, fb, lb, baseline[fb], EVENTS["corruption"], {fa: la})
            effect.power = _power(spec, treated, reference)
            effect.reasons.append(f"power at most that of {spec.label(fb)} {lb} vs {baseline[fb]} within "
                                  f"{spec.label(fa)} {la} ({_sessions(treated, reference)})")
    return effects


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "p n/a"
    return f"p = {p:.2g}" if p >= 0.0001 else "p < 0.0001"


def _arms(effect: Effect) -> str:
    return _sessions(effect.treated, effect.reference)


def _sessions(treated: Arm, reference: Arm) -> str:
    return f"{treated.k}/{treated.n} vs {reference.k}/{reference.n} sessions"


def verdict_paragraph(spec: MatrixSpec, analysis: MatrixAnalysis) -> str:
    """The findings in plain words, strongest first; every claim carries its counts and p-value."""
    sentences: list[str] = []
    order = {"causes": 0, "widens": 1, "reduces": 2, "inconclusive": 3, "not exercised": 4,
             "practically equivalent": 5, "no detectable effect": 6}
    for effect in sorted(analysis.factors, key=lambda e: order[e.verdict]):
        name = f"{spec.label(effect.factor)} {effect.level} (vs {effect.baseline})"
        if effect.verdict == "causes":
            why = f"; {'; '.join(effect.reasons)}" if effect.reasons else ""
            sentences.append(f"{name} causes corruption: {_arms(effect)} ({_fmt_p(effect.p_adjusted)}{why}).")
        elif effect.verdict == "widens" and effect.conditional:
            cond = effect.conditional
            sentences.append(
                f"{name} widens it: with {cond['within']}, {cond['treated']['k']}/{cond['treated']['n']} vs "
                f"{cond['reference']['k']}/{cond['reference']['n']} sessions ({_fmt_p(cond['p_adjusted'])}; "
                f"over every {spec.label(effect.widens or '')} level: {_arms(effect)})."
            )
        elif effect.verdict == "reduces":
            sentences.append(f"{name} reduces corruption: {_arms(effect)} ({_fmt_p(effect.p_adjusted)}).")
        elif effect.verdict == "practically equivalent" and effect.equivalence:
            eq = effect.equivalence
            sentences.append(
                f"{name}: practically equivalent ({_arms(effect)}; the difference lies in "
                f"[{100 * eq['low']:+.1f}, {100 * eq['high']:+.1f}] points, within ±{100 * eq['margin']:g})."
            )
        elif effect.verdict in ("inconclusive", "not exercised"):
            sentences.append(f"{name}: {effect.verdict} ({'; '.join(effect.reasons)}).")
        else:
            power = "power unknown"
            if effect.power is not None:
                power = f"power to detect {spec.design.detect * 100:.0f} points: {effect.power:.2f}"
            sentences.append(f"{name}: no detectable effect ({_arms(effect)}, {power}).")
    for effect in analysis.interactions:
        if effect.verdict in ("causes", "reduces"):
            word = "raises" if effect.verdict == "causes" else "lowers"
            sentences.append(f"The interaction {effect.label} {word} corruption ({_fmt_p(effect.p_adjusted)}).")
        elif effect.verdict == "inconclusive":
            sentences.append(f"The interaction {effect.label}: inconclusive ({'; '.join(effect.reasons)}).")
    for family, noun in ((analysis.timeouts, "timeouts"), (analysis.wedges, "wedged streams")):
        for effect in family:
            if effect.verdict in ("causes", "reduces"):
                word = "raises" if effect.verdict == "causes" else "lowers"
                sentences.append(
                    f"{spec.label(effect.factor)} {effect.level} (vs {effect.baseline}) {word} {noun}: "
                    f"{_arms(effect)} ({_fmt_p(effect.p_adjusted)})."
                )
    if not analysis.factors:
        sentences.append("No finished cells to analyse.")
    return " ".join(sentences)


def analyse(
    spec: MatrixSpec,
    runs: list[CellRun],
    cell_order: list[dict[str, str]],
    planned: int,
    *,
    effects: bool = True,
) -> MatrixAnalysis:
    """Everything matrix.json holds, from the runs finished so far. Without `effects` only the cells
    and run counts (cheap enough to rewrite after every run; the tests and regression come at the end)."""
    baseline = spec.baseline()
    totals = cell_counts(runs) if effects else {}
    order = [tuple((f, cell[f]) for f in spec.factors) for cell in cell_order]
    fitted = firth(spec, totals, baseline, interactions=True) if totals else None
    notes = [] if effects else ["per-factor analysis pending: it is written when the matrix ends"]
    main_fit = fitted
    if fitted is None and totals:
        main_fit = firth(spec, totals, baseline, interactions=False)
        if main_fit is not None:
            notes.append("two-factor interactions are not separable in the cells run; main effects only")
    comparisons = _comparisons(spec, baseline) if totals else []
    factors = [_effect(spec, totals, c, "corruption", main_fit) for c in comparisons]
    _judge_corruption(spec, totals, factors)
    _judge_exercise(spec, runs, factors)
    timeouts = [_effect(spec, totals, c, "timeout", None) for c in comparisons]
    wedges = [_effect(spec, totals, c, "wedge", None) for c in comparisons]
    _judge_secondary(spec, timeouts)
    _judge_secondary(spec, wedges)
    analysis = MatrixAnalysis(
        name=spec.name,
        alpha=spec.design.alpha,
        correction=spec.design.correction,
        baseline=baseline,
        cells=_cells(spec, runs, order),
        factors=factors,
        interactions=_interactions(spec, fitted, baseline, totals),
        timeouts=timeouts,
        wedges=wedges,
        verdict="",
        runs={
            "planned": planned,
            "finished": sum(r.status == "finished" for r in runs),
            "failed": sum(r.status == "failed" for r in runs),
        },
        notes=notes,
    )
    if effects:
        analysis.verdict = verdict_paragraph(spec, analysis)
    return analysis
