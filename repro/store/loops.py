"""Loop signals, and what a control arm says about each failing turn: pure functions over session records.

A **loop signal** is its own finding class, apart from markup damage ("corrupt"): the model kept
writing instead of answering. Three signals:

- `length-no-tool`: the turn ended at max_tokens (finish_reason "length") without a tool call;
- `repeated-span`: the checker's repetition-loop rule (dsml_checker.soft_rules) found one span
  repeated, in the parsed message or the raw text;
- `inflation`: the turn wrote at least `INFLATION` times the completion tokens of the same turn
  (session and turn number) in the control arm, and at least `INFLATION_MIN_TOKENS` more.

A **control arm** runs the same tasks (same seed, same session numbers) without the load
(concurrency 1) or on a reference endpoint. Each failing turn of the run under test is paired with the
control's turn of the same session and number: when that one fails too, the failure is the model's
(`in_control_too`); when it is clean, it came with the load (`load_only`); when the control has no
such turn (its session ended earlier, or the turn did not answer), `unpaired`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

from pydantic import Field, ValidationError

from repro.store.records import LoopCounts, SessionRecord, TurnRecord, _Record
from repro.store.rundir import DamagedRun, read_regular

CONTROL_JSON = "control.json"

LoopSignal = Literal["length-no-tool", "repeated-span", "inflation"]
LOOP_SIGNALS: tuple[LoopSignal, ...] = ("length-no-tool", "repeated-span", "inflation")
REPEAT_RULE = "repetition-loop"
INFLATION = 2.0
"""A turn writing this many times its control's completion tokens is inflated..."""
INFLATION_MIN_TOKENS = 256
"""...when that is also this many tokens more (short answers vary more than twice without a loop)."""

TurnKey = tuple[int, int]
"""(session_id, turn index): the same task's same turn in two arms."""


def own_signals(turn: TurnRecord) -> list[LoopSignal]:
    """The loop signals a turn shows on its own (without a control): length-no-tool, repeated-span."""
    found: list[LoopSignal] = []
    if turn.status == "ok" and turn.finish_reason == "length" and not turn.tool_calls:
        found.append("length-no-tool")
    if any(f.rule == REPEAT_RULE for f in (*turn.findings, *turn.raw_findings)):
        found.append("repeated-span")
    return found


def inflated(turn: TurnRecord, control: TurnRecord | None) -> bool:
    """Whether the turn wrote far more than the control's same turn did."""
    if control is None or turn.completion_tokens is None or control.completion_tokens is None:
        return False
    grown = turn.completion_tokens - control.completion_tokens
    return turn.completion_tokens >= INFLATION * control.completion_tokens and grown >= INFLATION_MIN_TOKENS


def turns_by_key(sessions: Sequence[SessionRecord]) -> dict[TurnKey, TurnRecord]:
    return {(s.session_id, t.index): t for s in sessions for t in s.turns}


def count_loops(sessions: Sequence[SessionRecord]) -> LoopCounts:
    """Loop signals over a run's own turns (no `inflation`: that needs a control's turns)."""
    counts = _no_loops(with_inflation=False)
    for turn in turns_by_key(sessions).values():
        _count(counts, own_signals(turn))
    return counts


def _no_loops(*, with_inflation: bool) -> LoopCounts:
    return LoopCounts(by_signal={s: 0 for s in LOOP_SIGNALS if with_inflation or s != "inflation"})


def _count(counts: LoopCounts, signals: list[LoopSignal]) -> None:
    for signal in signals:
        counts.by_signal[signal] += 1
    counts.turns += bool(signals)


def loop_signals(turn: TurnRecord, control: TurnRecord | None) -> list[LoopSignal]:
    """Every loop signal of a turn, inflation against its control turn included."""
    return [*own_signals(turn), *(["inflation"] if inflated(turn, control) else [])]  # type: ignore[list-item]


class Attribution(_Record):
    """Failing turns of the run under test, by what the control's same turn did."""

    in_control_too: int = 0
    """The control's turn failed too (in either class): the model's own failure."""
    load_only: int = 0
    """The control's turn was clean: the failure came with the load (or the deployment)."""
    unpaired: int = 0
    """The control has no answered turn of that session and number."""


class ArmComparison(_Record):
    """One control arm against the run under test."""

    arm: str
    """`concurrency-1`, `reference` or `feature-off`."""
    path: str
    """The control arm's run directory, relative to the run directory."""
    base_url: str | None = None
    concurrency: int | None = None
    sessions: int = 0
    paired_turns: int = 0
    """Turns of the run under test with an answered turn of the same session and number in the control."""
    corrupt: Attribution = Field(default_factory=Attribution)
    """Turns judged corrupt (markup damage), by the control's same turn."""
    loops: Attribution = Field(default_factory=Attribution)
    """Turns with a loop signal and no markup damage, by the control's same turn."""
    loop_counts: LoopCounts = Field(default_factory=LoopCounts)
    """Loop signals of the run under test, inflation against this control included."""
    control_loop_counts: LoopCounts = Field(default_factory=LoopCounts)
    """Loop signals of the control arm on its own."""
    control_corrupt_turns: int = 0
    feature: str | None = None
    """feature-off: the feature switched off (`hicache`, …); a turn failing in that arm too is not its doing."""
    feature_label: str | None = None
    flags: list[str] = Field(default_factory=list)
    """feature-off: the simulator flags that switched it off."""
    feature_off_confirmed: bool | None = None
    """feature-off: the arm's `/server_info` showed the feature off (None: it reported no such key)."""


class ControlReport(_Record):
    """control.json: the control arms of a run and what each says about its failing turns."""

    arms: list[ArmComparison] = Field(default_factory=list)
    ignore_eos: bool = False
    """Never set: repro does not ask any arm's server to ignore the end of sentence, so a loop is the model's."""


def read_control(run_dir: Path) -> ControlReport | None:
    """control.json of a run directory; None when the run had no control arm. DamagedRun when unreadable."""
    file = Path(run_dir) / CONTROL_JSON
    if not file.exists():
        return None
    try:
        return ControlReport.model_validate_json(read_regular(file))
    except OSError as err:
        raise DamagedRun(f"{file}: cannot read: {err.strerror or err}") from None
    except ValidationError as err:
        raise DamagedRun(f"{file}: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}") from None


def _fails(turn: TurnRecord | None) -> bool:
    return turn is not None and turn.status == "ok" and (turn.verdict == "corrupt" or bool(own_signals(turn)))


def compare(arm: str, path: str, main: Sequence[SessionRecord], control: Sequence[SessionRecord], *,
            control_loops: LoopCounts, base_url: str | None = None, concurrency: int | None = None) -> ArmComparison:
    """The run under test's failing turns attributed by the control arm's same turns; `control_loops` is
    the arm's own loop signals (count_loops of `control`, as the arm's summary.json holds them)."""
    theirs = {k: t for k, t in turns_by_key(control).items() if t.status == "ok"}
    result = ArmComparison(arm=arm, path=path, base_url=base_url, concurrency=concurrency, sessions=len(control),
                           loop_counts=_no_loops(with_inflation=True), control_loop_counts=control_loops,
                           control_corrupt_turns=sum(t.verdict == "corrupt" for t in theirs.values()))
    for key, turn in turns_by_key(main).items():
        other = theirs.get(key)
        signals = loop_signals(turn, other)
        _count(result.loop_counts, signals)  # every turn's, as count_loops counts them; attributed: answered ones
        if turn.status != "ok":
            continue
        result.paired_turns += other is not None
        if turn.verdict == "corrupt":
            tally = result.corrupt
        elif signals:
            tally = result.loops
        else:
            continue
        if other is None:
            tally.unpaired += 1
        elif _fails(other):
            tally.in_control_too += 1
        else:
            tally.load_only += 1
    return result


def loop_line(loops: LoopCounts) -> str:
    """One line on a run's own loop signals."""
    signals = ", ".join(f"{name} {count}" for name, count in loops.by_signal.items())
    return f"{loops.turns} turns with a loop signal ({signals}); not counted as corrupt"


def describe(comparison: ArmComparison) -> list[str]:
    """The comparison in a few plain lines (terminal and reports)."""
    c, lp = comparison.corrupt, comparison.loops
    signals = ", ".join(f"{k} {v}" for k, v in comparison.loop_counts.by_signal.items())
    gone, kept, name = "only under load", "in the control too (the model's)", comparison.arm
    if comparison.feature is not None:
        label = comparison.feature_label or comparison.feature
        gone, kept = f"gone with {label} off", f"with {label} off too (not {label}'s)"
        name = f"{comparison.arm}={comparison.feature}"
        if comparison.feature_off_confirmed is not True:
            name += " (/server_info did not confirm it off)"
    return [
        f"control {name} ({comparison.sessions} sessions, {comparison.paired_turns} turns paired): "
        f"corrupt turns: {c.load_only} {gone}, {c.in_control_too} {kept}, {c.unpaired} unpaired",
        f"  loop turns (not counted as corrupt): {lp.in_control_too} {kept}, "
        f"{lp.load_only} {gone}, {lp.unpaired} unpaired; signals: {signals}",
    ]
