"""The bisect commands' option ranges, checked before anything is created (no directory, no process).

A value outside its range either crashed a probe halfway (`--sessions 0`), or was accepted without
meaning (`--alpha 2`, `--max-probes 0`), or answered wrongly (`probe --bad-rate 0` sized a probe that could
only say "good"). Each is one line naming the option, as usage errors are.
"""

from __future__ import annotations

from repro.errors import UsageError


def check_at_least(option: str, value: int | None, least: int = 1) -> None:
    if value is not None and value < least:
        raise UsageError(f"{option} {value}: must be at least {least}")


def check_probability(option: str, value: float | None, *, one_allowed: bool = False) -> None:
    """A rate or error probability: strictly between 0 and 1 (1 itself when `one_allowed`)."""
    if value is None:
        return
    if not (0 < value < 1 or (one_allowed and value == 1)):
        where = "above 0 and at most 1" if one_allowed else "strictly between 0 and 1"
        raise UsageError(f"{option} {value:g}: must lie {where}")


def check_probe_options(*, sessions: int | None, max_rounds: int, alpha: float, beta: float, good_rate: float,
                        min_bad_rate: float) -> None:
    """The options every probe shares."""
    check_at_least("--sessions", sessions)
    check_at_least("--max-rounds", max_rounds)
    check_probability("--alpha", alpha)
    check_probability("--beta", beta)
    check_probability("--good-rate", good_rate)
    check_probability("--min-bad-rate", min_bad_rate)


def check_template(option: str, command: str | None, known: tuple[str, ...]) -> None:
    """Every `${name}` of `command` is one the command fills in."""
    if command is None:
        return
    from repro.matrix.spec import Template  # the spec's models load only when a command has one

    unknown = sorted(set(Template(command).get_identifiers()) - set(known))
    if unknown:
        names = ", ".join(f"${{{name}}}" for name in unknown)
        raise UsageError(f"{option}: unknown variable {names} (known: {', '.join(f'${{{k}}}' for k in known)})")
