"""The checker's vocabulary: the rule registry, one finding, and the verdict over a whole turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

Severity = Literal["hard", "soft", "info"]
Label = Literal["clean", "corrupt", "suspect"]


class Rule(NamedTuple):
    """A registered rule: how much it counts and what it means, in one line (unpacks as a pair)."""

    severity: Severity
    description: str


RULES: dict[str, Rule] = {
    # content and reasoning_content (docs/checker-rules.md)
    "sentinel": Rule("hard", "the DSML sentinel ｜DSML｜ appears in text outside a code span or fence"),
    "sentinel-variant": Rule("hard", "a garbled sentinel (ASCII, doubled or ‖ bars, a bar dropped or lost as U+FFFD, spaces, other case, misspelt) next to a DSML tag word"),
    "wrapper-tag": Rule("hard", "a tool-call block opener or closer, exact or misspelled, appears in text"),
    "bare-invoke": Rule("hard", "an invoke opener appears in text with no block opener before it"),
    "orphan-closer": Rule("hard", "a DSML closing tag appears in text without its opening tag"),
    "truncated-tag": Rule("hard", "the text ends inside a DSML or special-token tag"),
    "xml-tool-tags": Rule("hard", "non-DSML XML tool tags (<invoke name=…>, <function_calls>, <parameter … string=…>) in text"),
    "v3-special-tokens": Rule("hard", "DeepSeek V3-era tool-call special tokens, or their ASCII spellings, in text"),
    "control-token-leak": Rule("hard", "a chat-template control token or prompt placeholder leaked into text"),
    "duplicated-output": Rule("hard", "text of 40+ characters repeated back to back: the answer re-sent, or a block after a leak"),
    # structured tool_calls (rule 7)
    "message-shape": Rule("hard", "the message is not a JSON object"),
    "tool-call-shape": Rule("hard", "a tool_calls entry is not an object with a function object"),
    "bad-tool-name": Rule("hard", "a tool-call name is empty or contains quotes, angle brackets or whitespace"),
    "unknown-tool": Rule("hard", "a tool-call name is not among the request's tools"),
    "args-dsml": Rule("hard", "tool-call arguments contain DSML markup or DeepSeek special tokens"),
    "args-not-object": Rule("hard", "tool-call arguments are not a JSON object"),
    "ghost-call": Rule("hard", "tool-call arguments are empty although the tool's schema requires properties"),
    "args-schema": Rule("hard", "tool-call arguments violate the tool's JSON schema"),
    # consistency (rule 8)
    "finish-tool-calls-empty": Rule("hard", 'finish_reason is "tool_calls" but there are no tool_calls'),
    "dsml-leak-finish": Rule("hard", "tool-call markup is in the text, finish_reason is stop or length and there are no tool_calls"),
    "tool-choice-none": Rule("hard", 'tool_choice was "none" but the turn carries tool calls or tool-call markup'),
    "tool-choice-required": Rule("hard", 'tool_choice was "required" or a named function but there are no tool_calls'),
    "tool-choice-mismatch": Rule("hard", "tool_choice named a function but another function was called"),
    # what today's parsers make of damaged text (docs/parser-recall.md); hard, because each changes what the agent
    # acts on, and each has a clean look-alike kept out by its threshold
    "duplicate-call": Rule("hard", "the same call (name, equal arguments, none included) twice in one turn: a re-sent block parsed twice"),
    "reasoning-replayed": Rule("hard", "the content holds the reasoning (whole, 48+ characters, or a cut replay of 200+)"),
    "bare-tool-tags": Rule("hard", "<invoke name=…>/<parameter name=…> without the sentinel, naming the request's tools or parameters"),
    "resent-prefix": Rule("hard", "the text opens with a streaming buffer re-sent growing (Let me checkLet me check the…)"),
    "empty-turn": Rule("hard", "no content and no tool calls with finish_reason stop (reasoning alone included): nothing to act on"),
    "call-lost": Rule("hard", "the raw text shows a complete invoke that the parsed message has no call for"),
    "param-lost": Rule("hard", "a parsed call lacks a parameter that its invoke in the raw text shows"),
    "value-cut": Rule("hard", "a parsed string argument is a cut-short copy of the value the raw text shows (blanks aside)"),
    "parser-error": Rule("hard", "the server's parser raised on the raw text (run client-side): the server would have failed the turn"),
    # soft (rules 10–11)
    "repetition-loop": Rule("soft", "a short unit repeats in a loop (0000…, repeated n-grams)"),
    "rare-chars": Rule("soft", "a run of replacement, control, private-use or other rare characters"),
    "attr-damage": Rule("soft", "visible DSML tags with damaged attributes (string flag, quotes, duplicates, prose between parameters)"),
    # info
    "quoted-dsml": Rule("info", "DSML markup quoted inside a Markdown code span or fence"),
    # raw text against DeepSeek's reference grammar (check_raw): every departure is hard, since a strict parser
    # rejects the turn and today's lenient ones repair, drop or duplicate calls without a trace
    "raw-eos-early": Rule("hard", "raw: text generated after the end-of-sentence token"),
    "raw-think-missing": Rule("hard", "raw: thinking mode was on and the complete text has no </think>: the reasoning never ended"),
    "raw-think-replayed": Rule("hard", "raw: a second </think> in the answer: the reasoning replayed after it"),
    "raw-dsml-in-reasoning": Rule("hard", "raw: tool-call markup before </think>: the block emitted while thinking"),
    "raw-sentinel-garbled": Rule("hard", "raw: a DSML tag with ASCII, doubled or ‖ bars, a bar dropped or lost as U+FFFD, or spaces, in its sentinel"),
    "raw-opener-misspelled": Rule("hard", "raw: the block opener misspelled or foreign (<｜DSML｜toolcalls>, function_calls in V4)"),
    "raw-opener-missing": Rule("hard", "raw: complete invokes with no block opener before them"),
    "raw-bare-invoke": Rule("hard", "raw: an invoke opener outside any block, never closed"),
    "raw-block-marker": Rule("hard", "raw: the block opener not preceded by the blank line (\\n\\n) the grammar requires"),
    "raw-block-unterminated": Rule("hard", "raw: the text ends inside the block although the turn was not cut by length"),
    "raw-text-after-block": Rule("hard", "raw: text other than end-of-sentence after the block closer"),
    "raw-orphan-closer": Rule("hard", "raw: a stray DSML closer after the block"),
    "raw-second-block": Rule("hard", "raw: a second tool-call block after the first (the answer or block repeated)"),
    "raw-attr-quotes": Rule("hard", "raw: a typographic or other non-ASCII quote around a tag attribute"),
    "raw-string-attr": Rule("hard", 'raw: a parameter\'s string attribute missing or not "true"/"false"'),
    "raw-param-json": Rule("hard", 'raw: a string="false" value (or JSON body) that is not valid JSON'),
    "raw-param-duplicate": Rule("hard", "raw: the same parameter twice in one invoke"),
    "raw-invoke-name": Rule("hard", "raw: an invoke name that is empty or holds a quote or newline"),
    "raw-closer-in-value": Rule("hard", "raw: a parameter closer (often cut short) inside a value, ending it early"),
    "raw-markup-in-value": Rule("hard", "raw: a parsed parameter value holds DSML markup"),
    "raw-tag-fragment": Rule("hard", "raw: a DSML tag inside the block that is cut short or not one of the grammar's tags"),
    "raw-tag-grammar": Rule("hard", "raw: any other departure from the block grammar (separators, tag order, attribute layout)"),
    "raw-truncated": Rule("info", "raw: the turn was cut by max tokens (finish_reason length) inside a tag or the block"),
}

_EXCERPT_BEFORE = 20
_EXCERPT_MAX = 80


@dataclass(frozen=True)
class Finding:
    """One rule firing on one field, with the character span it fired on."""

    rule: str
    field: str
    start: int
    end: int
    excerpt: str
    severity: Severity

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "field": self.field,
            "start": self.start,
            "end": self.end,
            "excerpt": self.excerpt,
            "severity": self.severity,
        }


_SEVERITY = {rule: entry.severity for rule, entry in RULES.items()}
_new_object = object.__new__


def make_finding(rule: str, field: str, text: str, start: int, end: int) -> Finding:
    """A finding for `rule` on text[start:end], with a short excerpt around it; severity from the registry."""
    lo = start - _EXCERPT_BEFORE if start > _EXCERPT_BEFORE else 0
    hi = (end if end > lo else lo) + _EXCERPT_BEFORE
    if hi > lo + _EXCERPT_MAX:
        hi = lo + _EXCERPT_MAX
    # The frozen dataclass's __init__ sets each field through object.__setattr__, which costs more than the
    # rest of a clean turn's bookkeeping; the instance is filled in directly, as equal as one built by __init__.
    found = _new_object(Finding)
    found.__dict__.update(rule=rule, field=field, start=start, end=end, excerpt=text[lo:hi], severity=_SEVERITY[rule])
    return found


@dataclass(frozen=True)
class Verdict:
    """The judgement of one whole turn: corrupt on any hard finding, suspect on soft ones only."""

    label: Label
    findings: tuple[Finding, ...]

    @classmethod
    def of(cls, findings: tuple[Finding, ...]) -> Verdict:
        severities = {f.severity for f in findings}
        label: Label = "corrupt" if "hard" in severities else "suspect" if "soft" in severities else "clean"
        return cls(label, findings)

    @property
    def hard(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "hard")

    @property
    def soft(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "soft")

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.rule for f in self.findings))

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "findings": [f.to_dict() for f in self.findings]}
