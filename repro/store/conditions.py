"""`exercise:` conditions of a matrix level: what must hold of a cell's metrics for the level to have acted.

A condition is `TERM OP NUMBER`. TERM is a fact of `repro.store.exercise` (`host_load_back_tokens`,
`evicted_tokens`, …), or `delta(METRIC)` (how much a counter rose over the run) or `peak(METRIC)` (the
largest value a gauge showed), METRIC being a Prometheus series such as
`sglang:cached_tokens_total{cache_source="host"}`. OP is one of `> >= < <= == !=`. Pure: parsing
and evaluation only.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from repro.store.exercise import FACTS, Scrapes, metric_text

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}
_NAME = r"[A-Za-z_:][A-Za-z0-9_:]*"
_PATTERN = re.compile(
    rf"^\s*(?:(?P<fact>{_NAME})|(?P<fn>delta|peak)\(\s*(?P<metric>{_NAME})\s*(?:\{{(?P<labels>[^}}]*)\}})?\s*\))"
    rf"\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
_LABEL = re.compile(rf'\s*({_NAME})\s*=\s*"([^"]*)"\s*(?:,|$)')


class ConditionError(ValueError):
    """A condition that cannot be parsed, or that names what the target does not export."""


@dataclass(frozen=True)
class Condition:
    text: str
    fact: str | None
    function: str | None
    metric: str | None
    labels: Mapping[str, str]
    op: str
    number: float

    def term(self) -> str:
        return self.fact or f"{self.function}({metric_text(self.metric or '', self.labels)})"


def _labels(text: str | None) -> dict[str, str]:
    if not text or not text.strip():
        return {}
    found = _LABEL.findall(text)
    if "".join(f'{k}="{v}"' for k, v in found) != re.sub(r"\s|,", "", text):
        raise ConditionError(f'bad labels {{{text}}}: write them as {{name="value", ...}}')
    return dict(found)


def parse(text: str) -> Condition:
    """A parsed condition; ConditionError naming what is wrong otherwise."""
    match = _PATTERN.match(text)
    if match is None:
        raise ConditionError(f"cannot parse exercise condition {text!r}: write FACT OP NUMBER or delta(METRIC) OP NUMBER "
                             f"or peak(METRIC) OP NUMBER, e.g. 'host_load_back_tokens > 0'")
    fact = match["fact"]
    if fact is not None and fact not in FACTS:
        raise ConditionError(f"exercise condition {text!r}: unknown fact {fact!r} (one of {', '.join(FACTS)}; "
                             "or delta(METRIC) / peak(METRIC))")
    return Condition(text=text.strip(), fact=fact, function=match["fn"], metric=match["metric"],
                     labels=_labels(match["labels"]), op=match["op"], number=float(match["number"]))


@dataclass(frozen=True)
class Outcome:
    condition: Condition
    value: float
    held: bool

    def line(self) -> str:
        verb = "holds" if self.held else "does not hold"
        return f"{self.condition.text} {verb} ({self.condition.term()} = {self.value:g})"


def evaluate(condition: Condition, scrapes: Scrapes) -> Outcome:
    """Whether the condition holds on a run's scrapes; ConditionError when the target exports nothing it names."""
    if condition.fact is not None:
        fact = FACTS[condition.fact](scrapes)
        if fact.value is None:
            raise ConditionError(f"exercise condition {condition.text!r}: the target exports no {fact.metric}")
        value = fact.value
    else:
        assert condition.metric is not None
        # A labelled series that was never incremented is absent: only an unknown metric name is an error.
        if not scrapes.has(condition.metric):
            raise ConditionError(f"exercise condition {condition.text!r}: the target exports no metric "
                                 f"{condition.metric!r}")
        read = scrapes.delta if condition.function == "delta" else scrapes.peak
        value = read(condition.metric, condition.labels) or 0.0
    return Outcome(condition, value, OPERATORS[condition.op](value, condition.number))


def validate(value: Any) -> list[str]:
    """A spec's `exercise:` value checked as text: a list of parsable conditions (a lone string is one)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ConditionError("exercise: a condition or a list of conditions (strings)")
    for item in items:
        parse(item)
    return [item.strip() for item in items]
