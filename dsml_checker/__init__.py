"""dsml_checker: decide whether a model's turn is clean or carries broken DeepSeek DSML tool-call markup."""

from dsml_checker.check import check
from dsml_checker.findings import RULES, Finding, Rule, Verdict
from dsml_checker.formats import (
    Completion,
    DSMLParseError,
    ToolCall,
    parse_calls,
    render_calls,
    render_completion,
    split_completion,
)
from dsml_checker.stream import StreamAccumulator

__all__ = [
    "RULES",
    "Completion",
    "DSMLParseError",
    "Finding",
    "Rule",
    "StreamAccumulator",
    "ToolCall",
    "Verdict",
    "check",
    "parse_calls",
    "render_calls",
    "render_completion",
    "split_completion",
]
