"""A deployment configuration as settings ('FLAGS / ENV'), the differences between two of them, and
the configuration with a subset of those differences applied: the items of the flag bisection.

`--a --b 2 --no-c / X=1 Y=2` holds four settings: `--a` (on), `--b` (2), `--c` (off, from its
`--no-` form) and the environment variables X and Y. Pure functions.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from repro.errors import UsageError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Setting:
    """One flag or environment variable; `value` None for a flag given without a value."""

    key: str
    """`--flag` (its `--no-` form folded in) or `env:NAME`."""
    tokens: tuple[str, ...]
    """How it is written on the command line (empty for an environment variable)."""
    value: str | None

    def __str__(self) -> str:
        if self.key.startswith("env:"):
            return f"{self.key[4:]}={self.value}"
        return " ".join(self.tokens)


Config = dict[str, Setting]


def read_config(text: str, *, option: str) -> Config:
    """Settings from 'FLAGS / ENV' (either part may be empty); `@FILE` reads the text from a file."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"{option} {text}: cannot read: {getattr(err, 'strerror', None) or err}") from None
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        raise UsageError(f"{option}: cannot split into words: {err}") from None
    if tokens.count("/") > 1:
        raise UsageError(f"{option}: more than one '/' (write 'FLAGS / ENV')")
    cut = tokens.index("/") if "/" in tokens else len(tokens)
    config: Config = {}
    for setting in [*_flags(tokens[:cut], option), *_env(tokens[cut + 1:], option)]:
        if setting.key in config:
            raise UsageError(f"{option}: {setting.key.removeprefix('env:')} is given twice")
        config[setting.key] = setting
    return config


def _flags(tokens: Sequence[str], option: str) -> list[Setting]:
    found, i = [], 0
    while i < len(tokens):
        flag = tokens[i]
        if not flag.startswith("--") or flag == "--":
            raise UsageError(f"{option}: expected a --flag, got {flag!r} (write 'FLAGS / ENV')")
        name, eq, inline = flag.partition("=")
        if eq:
            found.append(Setting(name, (flag,), inline))
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--") and tokens[i + 1] != "/":
            found.append(Setting(flag, (flag, tokens[i + 1]), tokens[i + 1]))
            i += 2
        elif flag.startswith("--no-"):
            found.append(Setting("--" + flag[5:], (flag,), "off"))
            i += 1
        else:
            found.append(Setting(flag, (flag,), None))
            i += 1
    return found


def _env(tokens: Sequence[str], option: str) -> list[Setting]:
    found = []
    for token in tokens:
        name, eq, value = token.partition("=")
        if not eq or not _ENV_NAME.match(name):
            raise UsageError(f"{option}: expected NAME=VALUE after '/', got {token!r}")
        found.append(Setting(f"env:{name}", (), value))
    return found


@dataclass(frozen=True)
class Change:
    """A setting as the good configuration has it (None: absent) and as the bad one has it."""

    key: str
    good: Setting | None
    bad: Setting | None

    def __str__(self) -> str:
        before = str(self.good) if self.good else "(absent)"
        after = str(self.bad) if self.bad else "(absent)"
        return f"{before} -> {after}"


def differences(good: Config, bad: Config) -> list[Change]:
    """Every setting the two configurations hold differently, in the bad configuration's order, then the good's."""
    keys = [*bad, *(k for k in good if k not in bad)]
    return [Change(k, good.get(k), bad.get(k)) for k in keys if good.get(k) != bad.get(k)]


def apply(good: Config, changes: Sequence[Change], subset: Sequence[int]) -> Config:
    """The good configuration with the changes at `subset` made as in the bad one."""
    config = dict(good)
    for index in subset:
        change = changes[index]
        if change.bad is None:
            config.pop(change.key, None)
        else:
            config[change.key] = change.bad
    return config


def command_line(config: Config) -> tuple[list[str], dict[str, str]]:
    """The flags (in the configuration's order) and the environment of a configuration."""
    flags = [token for s in config.values() if not s.key.startswith("env:") for token in s.tokens]
    env = {s.key[4:]: s.value or "" for s in config.values() if s.key.startswith("env:")}
    return flags, env
