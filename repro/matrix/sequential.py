"""`design: {sequential: true}`: the matrix in rounds, a look after each, and which cells are still needed.

Round r runs replicate r of every cell some undecided verdict still needs (its runs are the fixed
plan's `<cell>-r<r>`, in that block's random order), so a cell's server starts at most once a round
and never more often than in the fixed design, whose `replicates` is the cap on rounds (K).

Family-wise error across the looks: Bonferroni over the K looks fixed before the first, then the
spec's correction (Holm) across the factors within a look. Each look runs the whole analysis at
alpha / K, so the chance that any look wrongly finds an effect is at most K * (alpha / K) = alpha.
That sum does not depend on which cells the rounds run: the cells of round r are chosen from the
looks before it, never from round r's own sessions. What the choice does touch is that each look's
exact tests take the arms' session counts as given, while the rounds set them from earlier data;
the choice only ever leaves out cells of comparisons that are already findings (or of strata that
show no corruption), it never picks cells by how close a comparison is to significance. The last
look's verdicts are at alpha / K too (what early stopping costs).

A comparison is decided once its verdict is a finding (causes, widens, reduces) that more data would
not relabel, or "practically equivalent" (its whole difference interval within ±design.margin, tested
at the look's alpha / K like every finding, so the Bonferroni sum bounds a wrong equivalence too). "No detectable effect" and "inconclusive" are not decisions before the last round (they
are statements about too little data), so they keep every cell in their arms running.

Causes that "act only together" (no corruption yet in any cell without each of them) are findings
(each raises corruption, significantly at this look) whose ranking is still open: one corrupt session
without one of them makes the others the cause and this one their amplifier (widens). Only the cells
with exactly one of them at its baseline and the others at their causing levels (with two of them: the
cells with exactly one on) rank them that way, so a round runs only those:
- the cell with all of them on is in no open question: its sessions entered the findings, and more of
  them only add to the size of an effect already shown;
- a cell with two or more of them at baseline (with two: the control, neither on) could show
  corruption without one of them too, but never as the likelier place: while no factor reduces
  corruption (no look has found a "reduces"), turning one of them on does not lower the rate, so such a
  cell's rate is at most that of the exactly-one cells beside it. If those show none, it is the least
  likely to; if it corrupts at all, they corrupt at least as often and rank the causes no later. Once
  a look finds a factor that reduces corruption, monotonicity is not assumed and the ranking keeps
  every cell in the causes' arms running.
Leaving those cells out changes a verdict only when a left-out cell would corrupt and the cells run
would not, the least likely outcome of the round under monotonicity; benchmarks/sequential_matrix.py
compares the verdicts with the fixed design's on the same runs.

A cell is needed while an open question needs it (above), except in a stratum a decided cause rules
out: when a factor causes corruption at level L and every cell with it at its baseline has shown none,
those cells carry no information for the stratified (conditional) tests of other factors, whose
tables there stay 0 of n in both arms.

The looks are a function of progress.jsonl alone, so `--resume` recomputes them and continues from
the first round that did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from repro.matrix.analysis import MOVED, TOGETHER, CellRun, Effect, MatrixAnalysis, analyse, cell_counts
from repro.matrix.design import Cell, PlannedRun
from repro.matrix.spec import MatrixSpec

DECIDED = (*MOVED, "practically equivalent")
"""Verdicts that need no further round (see undecided): the factor moved the rate, or is practically equivalent."""
METHOD = "Bonferroni over the rounds' looks (alpha / K each), {correction} across the factors within a look"


def max_rounds(spec: MatrixSpec) -> int:
    return spec.design.replicates


def look_spec(spec: MatrixSpec) -> MatrixSpec:
    """The spec whose analysis one look runs: alpha split evenly over the K looks."""
    design = spec.design.model_copy(update={"alpha": spec.design.alpha / max_rounds(spec)})
    return spec.model_copy(update={"design": design})


def undecided(analysis: MatrixAnalysis) -> list[Effect]:
    """The comparisons a next round could still change: no finding yet, or causes that act only together
    (no corruption without each of them so far: one corrupt session without one of them would rank them)."""
    return [
        effect for effect in analysis.factors
        if effect.verdict not in DECIDED or any(reason.startswith(TOGETHER) for reason in effect.reasons)
    ]


def together(analysis: MatrixAnalysis) -> list[Effect]:
    """The causes that act only together (no corruption yet without each of them): open only in their ranking."""
    return [
        effect for effect in analysis.factors
        if effect.verdict == "causes" and any(reason.startswith(TOGETHER) for reason in effect.reasons)
    ]


def ranks_together(cell: Cell, group: list[Effect]) -> bool:
    """Whether `cell` can rank causes that act only together: exactly one of them at its baseline, the
    others at their causing levels (with two of them: the cells with exactly one)."""
    at_baseline = [e for e in group if cell.level(e.factor) == e.baseline]
    causing = {e.factor for e in group if cell.level(e.factor) == e.level}
    return len(at_baseline) == 1 and causing == {e.factor for e in group} - {at_baseline[0].factor}


def needed_cells(spec: MatrixSpec, analysis: MatrixAnalysis, design_cells: list[Cell], runs: list[CellRun]) -> list[Cell]:
    """The cells some undecided comparison still needs, in `design_cells`' order.

    An open comparison that is not a finding needs every cell in its arms. Causes that act only together
    are findings open only in their ranking: they need only the cells that can rank them
    (`ranks_together`), as long as no factor's level reduces corruption (the monotonicity that lets
    the cells with more of them off be left out; see the module docstring). Either way a cell in a
    stratum a decided cause rules out is not needed.
    """
    open_effects = undecided(analysis)
    group = together(analysis)
    if any(e.verdict == "reduces" for e in analysis.factors):
        group = []
    unranked = [e for e in open_effects if e not in group]
    totals = cell_counts(runs)
    causes = [e for e in analysis.factors if e.verdict == "causes" and e not in open_effects]

    def ruled_out(cell: Cell) -> bool:
        for cause in causes:
            if cell.level(cause.factor) != cause.baseline:
                continue
            at_baseline = [key for key in totals if dict(key)[cause.factor] == cause.baseline]
            if at_baseline and all(totals[key].corrupt == 0 for key in at_baseline):
                return True
        return False

    def needed(cell: Cell) -> bool:
        in_arms = any(cell.level(e.factor) in (e.level, e.baseline) for e in unranked)
        return in_arms or (bool(group) and ranks_together(cell, group))

    return [cell for cell in design_cells if needed(cell) and not ruled_out(cell)]


@dataclass
class RoundLook:
    """What the look after one round saw and decided."""

    round: int
    runs: list[str]
    decided: dict[str, str]
    """Comparison label -> verdict, for every decided comparison."""
    undecided: list[str]
    next_cells: list[str]
    """The cells the next round runs (empty: the matrix stops)."""


@dataclass
class SequentialRecord:
    """matrix.json's `sequential`: the rule, the looks, what was spent against the fixed design, and why it stopped."""

    method: str
    alpha: float
    alpha_per_look: float
    max_rounds: int
    rounds: int
    looks: list[RoundLook]
    sessions: int
    fixed_sessions: int
    server_starts: int
    fixed_server_starts: int
    stopped: str
    saved: dict[str, Any] = field(default_factory=dict)


def round_runs(planned: Iterable[PlannedRun], round_: int, cells: list[Cell]) -> list[PlannedRun]:
    """Round `round_`'s runs: the plan's replicate-`round_` runs of `cells`, in the plan's order."""
    wanted = set(cells)
    return [run for run in planned if run.replicate == round_ and run.cell in wanted]


def after_round(
    spec: MatrixSpec, round_: int, ran: list[PlannedRun], records: list[CellRun], cell_order: list[dict[str, str]],
    planned: int, design_cells: list[Cell],
) -> RoundLook:
    """The look after round `round_` over every record so far, and the cells the next round runs."""
    analysis = look(spec, records, cell_order, planned)
    open_effects = undecided(analysis)
    following = [] if round_ >= max_rounds(spec) else needed_cells(spec, analysis, design_cells, records)
    return RoundLook(
        round=round_, runs=[run.key for run in ran],
        decided={e.label: e.verdict for e in analysis.factors if e not in open_effects},
        undecided=[e.label for e in open_effects], next_cells=[cell.name for cell in following],
    )


def look(spec: MatrixSpec, runs: list[CellRun], cell_order: list[dict[str, str]], planned: int) -> MatrixAnalysis:
    """The analysis one look runs: every finished run so far, at alpha / K."""
    return analyse(look_spec(spec), runs, cell_order, planned)


def record(
    spec: MatrixSpec, looks: list[RoundLook], runs: list[CellRun], planned: int, *, interrupted: bool
) -> SequentialRecord:
    """What the sequential matrix spent against the fixed design (every planned run, each its spec's sessions)."""
    k = max_rounds(spec)
    per_run = int(spec.load.get("sessions", 0))
    sessions = sum(sum(r.counts.values()) for r in runs if r.status == "finished")
    starts = len(runs)
    last = looks[-1] if looks else None
    if interrupted:
        stopped = f"interrupted in round {len(looks) + 1}"
    elif last is None:
        stopped = "no round finished"
    elif not last.undecided:
        stopped = f"every factor decided after round {last.round} of at most {k}"
    elif last.next_cells:
        stopped = f"a run of round {last.round + 1} failed (--keep-going runs on past a failed run)"
    elif last.round >= k:
        stopped = (f"reached the cap of {k} rounds with {len(last.undecided)} comparison(s) not decided "
                   f"({', '.join(last.undecided)}): their verdicts are those of the last look")
    else:
        stopped = f"no cell is needed after round {last.round}"
    fixed_sessions = planned * per_run
    saved = {
        "sessions": 1 - sessions / fixed_sessions if fixed_sessions else 0.0,
        "server_starts": 1 - starts / planned if planned else 0.0,
    }
    return SequentialRecord(
        method=METHOD.format(correction=spec.design.correction), alpha=spec.design.alpha,
        alpha_per_look=spec.design.alpha / k, max_rounds=k, rounds=len(looks), looks=looks, sessions=sessions,
        fixed_sessions=fixed_sessions, server_starts=starts, fixed_server_starts=planned, stopped=stopped, saved=saved,
    )


def summary_lines(spent: dict[str, Any]) -> list[str]:
    """matrix.json's `sequential` in plain lines, for the reports: the rule, each look, what was saved, why it stopped."""
    lines = [
        f"Sequential design: at most {spent['max_rounds']} rounds; {spent['method']}: each look at alpha "
        f"{spent['alpha_per_look']:.3g} (family-wise {spent['alpha']:g}).",
    ]
    for entry in spent["looks"]:
        decided = ", ".join(f"{label}: {verdict}" for label, verdict in entry["decided"].items()) or "nothing"
        following = f"next round: {', '.join(entry['next_cells'])}" if entry["next_cells"] else "no next round"
        lines.append(f"Round {entry['round']} ({len(entry['runs'])} runs): decided {decided}; {following}.")
    lines.append(
        f"Spent {spent['rounds']} round(s), {spent['sessions']} sessions and {spent['server_starts']} server starts, "
        f"against {spent['fixed_sessions']} sessions and {spent['fixed_server_starts']} starts for the fixed design "
        f"({100 * spent['saved']['sessions']:.0f}% and {100 * spent['saved']['server_starts']:.0f}% saved)."
    )
    lines.append(f"Stopped: {spent['stopped']}.")
    return lines
