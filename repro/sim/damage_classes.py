"""Damage classes for measuring parsers: generated damage nobody hand-picked, beyond the simulator's operators.

The simulator injects `repro.sim.corrupt.OPERATORS` (what a stale cache read does). To measure how a parser
emulation agrees with the real parser, and how often the checker catches what each parser returns, damage
must also come in shapes no fixture covers. Each class here rewrites a raw V4 turn at a place chosen by an
`rng` (so a seed replays it) and returns None when the text has nowhere it fits. The classes include the
shapes where a hand emulation of DeepSeek's parser was seen to part from the real one: a parameter header
read to its first space, a damaged invoke name, a tag misspelt once inside a block, a closer cut short with
more parameters, invokes and re-sent blocks after it, a damaged block opener, a text ending inside a closer,
a block restarted inside an invoke name. Pure: no I/O.
"""

from __future__ import annotations

import random
from typing import Callable

from dsml_checker.formats import EOS, SENTINEL, THINK_CLOSE
from repro.sim.corrupt import OPERATORS

DamageClass = Callable[[str, random.Random], str | None]
"""(raw V4 turn, rng) -> the damaged turn, or None when it does not fit."""

_OPEN = "<" + SENTINEL
_CLOSE = "</" + SENTINEL
_BLOCK_OPEN = f"{_OPEN}tool_calls>"
_BLOCK_CLOSE = f"{_CLOSE}tool_calls>"
_TAGS = (f"{_OPEN}tool_calls>", f"{_CLOSE}tool_calls>", f'{_OPEN}invoke name="', f"{_CLOSE}invoke>",
         f'{_OPEN}parameter name="', f"{_CLOSE}parameter>", THINK_CLOSE, '">', '"', "\n", " string=\"true\">")


def _sites(text: str, token: str) -> list[int]:
    at, out = text.find(token), []
    while at >= 0:
        out.append(at)
        at = text.find(token, at + 1)
    return out


def _pick(text: str, token: str, rng: random.Random) -> int | None:
    sites = _sites(text, token)
    return rng.choice(sites) if sites else None


def header_space(raw: str, rng: random.Random) -> str | None:
    """A parameter header with an attribute pasted into its name: `name="q string="true">a`."""
    at = _pick(raw, f'{_OPEN}parameter name="', rng)
    if at is None:
        return None
    key_at = at + len(f'{_OPEN}parameter name="')
    junk = rng.choice([' string="true">', " ", " x", '"', " string="])
    return raw[:key_at + 1] + junk + raw[key_at + 1 :]


def invoke_name(raw: str, rng: random.Random) -> str | None:
    """An invoke's name damaged: emptied, a quote lost or doubled, typographic quotes, a space inside."""
    at = _pick(raw, f'{_OPEN}invoke name="', rng)
    if at is None:
        return None
    name_at = at + len(f'{_OPEN}invoke name="')
    end = raw.find('">', name_at)
    if end < 0:
        return None
    name = raw[name_at:end]
    new = rng.choice(["", name[: len(name) // 2], name + '"', "“" + name + "”", name[:1] + " " + name[1:], name + " "])
    if new.startswith("“"):
        return raw[: name_at - 1] + new + raw[end + 1 :]
    return raw[:name_at] + new + raw[end:]


def misspelt_tag(raw: str, rng: random.Random) -> str | None:
    """One tag inside the block misspelt once (a letter lost, doubled or changed)."""
    sites = [i for word in ("invoke", "parameter") for i in _sites(raw, SENTINEL + word)]
    if not sites:
        return None
    at = rng.choice(sites) + len(SENTINEL)
    word_len = 6 if raw.startswith("invoke", at) else 9
    i = at + rng.randrange(word_len)
    return raw[:i] + rng.choice(["", raw[i] * 2, "x"]) + raw[i + 1 :]


def closer_cut(raw: str, rng: random.Random) -> str | None:
    """A parameter or invoke closer cut short (`</｜DSML｜param`), the rest of the block after it."""
    tag = rng.choice([f"{_CLOSE}parameter>", f"{_CLOSE}invoke>"])
    at = _pick(raw, tag, rng)
    if at is None:
        return None
    keep = rng.randrange(2, len(tag) - 1)
    return raw[: at + keep] + raw[at + len(tag) :]


def resent_block(raw: str, rng: random.Random) -> str | None:
    """The block sent again after a closer cut short: the re-sent buffer of a failed stream."""
    start, end = raw.find(_BLOCK_OPEN), raw.find(_BLOCK_CLOSE)
    if start < 0 or end < 0:
        return None
    block = raw[start : end + len(_BLOCK_CLOSE)]
    cut = closer_cut(block, rng) or block
    return raw[:start] + cut + "\n\n" + block + raw[end + len(_BLOCK_CLOSE) :]


def opener_damaged(raw: str, rng: random.Random) -> str | None:
    """The block opener damaged: a letter lost or changed, its `>` or newline lost, another block name."""
    at = raw.find(_BLOCK_OPEN)
    if at < 0:
        return None
    new = rng.choice([f"{_OPEN}tool_cals>", f"{_OPEN}tool_calls", f"{_OPEN}tools>", f"{_OPEN}tool_call>",
                      f"{_OPEN}function_calls>", f"{_OPEN}tool_callss>", f"{_OPEN}tool_calls>>"])
    return raw[:at] + new + raw[at + len(_BLOCK_OPEN) :]


def end_in_closer(raw: str, rng: random.Random) -> str | None:
    """The text ends inside a closer (a cut by max tokens or a dropped stream)."""
    tag = rng.choice([f"{_CLOSE}parameter>", f"{_CLOSE}invoke>", _BLOCK_CLOSE])
    at = _pick(raw, tag, rng)
    if at is None:
        return None
    return raw[: at + rng.randrange(1, len(tag))]


def restart_in_name(raw: str, rng: random.Random) -> str | None:
    """A block restarted inside an invoke name: `name="rea<｜DSML｜tool_calls>\\n<｜DSML｜invoke name="read">…`."""
    at = _pick(raw, f'{_OPEN}invoke name="', rng)
    start = raw.find(_BLOCK_OPEN)
    if at is None or start < 0:
        return None
    name_at = at + len(f'{_OPEN}invoke name="')
    cut = name_at + rng.randrange(0, max(1, raw.find('"', name_at) - name_at))
    return raw[:cut] + raw[start:]


def span_dropped(raw: str, rng: random.Random) -> str | None:
    """A random span of 1-12 characters inside the markup lost."""
    start = raw.find(_OPEN)
    if start < 0:
        return None
    at = rng.randrange(start, len(raw) - 1)
    return raw[:at] + raw[at + rng.randint(1, 12) :]


def token_inserted(raw: str, rng: random.Random) -> str | None:
    """A markup token (a tag, a quote, `</think>`, a newline) inserted anywhere after the reasoning."""
    start = raw.find(THINK_CLOSE)
    at = rng.randrange(max(0, start), len(raw.removesuffix(EOS)) + 1)
    return raw[:at] + rng.choice(_TAGS) + raw[at:]


def lost_bar(raw: str, rng: random.Random) -> str | None:
    """One sentinel lost a bar, or a bar's bytes at a token boundary (U+FFFD, or nothing)."""
    at = _pick(raw, SENTINEL, rng)
    if at is None:
        return None
    return raw[:at] + rng.choice(["DSML｜", "｜DSML", "\ufffdDSML｜", "｜DSML\ufffd", "DSML"]) + raw[at + len(SENTINEL) :]


def truncated(raw: str, rng: random.Random) -> str | None:
    """The text cut anywhere after the reasoning (no end of sentence: a max-tokens cut)."""
    start = raw.find(THINK_CLOSE)
    return raw[: rng.randrange(max(0, start) + 1, len(raw.removesuffix(EOS)))] if len(raw) > start + 2 else None


def think_dropped(raw: str, rng: random.Random) -> str | None:
    """The reasoning's `</think>` lost, whole or in part: the reasoning runs into the answer."""
    at = raw.find(THINK_CLOSE)
    if at < 0:
        return None
    return raw[:at] + rng.choice(["", "</think", "think>", "<think>", "</thin"]) + raw[at + len(THINK_CLOSE) :]


def _simulator_operator(name: str) -> DamageClass:
    operator = OPERATORS[name]

    def damage(raw: str, rng: random.Random) -> str | None:
        reasoning, _, body = raw.partition(THINK_CLOSE)
        return operator(reasoning, body.removesuffix(EOS), "read_file")

    damage.__doc__ = operator.__doc__
    return damage


GENERATED: dict[str, DamageClass] = {
    "header_space": header_space,
    "invoke_name": invoke_name,
    "misspelt_tag": misspelt_tag,
    "closer_cut": closer_cut,
    "resent_block": resent_block,
    "opener_damaged": opener_damaged,
    "end_in_closer": end_in_closer,
    "restart_in_name": restart_in_name,
    "span_dropped": span_dropped,
    "token_inserted": token_inserted,
    "lost_bar": lost_bar,
    "truncated": truncated,
    "think_dropped": think_dropped,
}
"""The generated classes (module docstring); the first eight are the shapes where the emulation was seen to part."""

CLASSES: dict[str, DamageClass] = {**GENERATED, **{f"sim:{name}": _simulator_operator(name) for name in OPERATORS}}
"""Every damage class: the generated ones, then the simulator's operators (`sim:` + the operator's name)."""
