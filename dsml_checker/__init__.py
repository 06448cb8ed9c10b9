"""dsml_checker: decide whether a model's turn is clean or carries broken DeepSeek DSML tool-call markup.

Standard library only, no I/O. `check(message, finish_reason=, tools=, tool_choice=)` returns a `Verdict`
("clean", "corrupt" on any hard finding, "suspect" on soft ones only) with its `Finding`s; `RULES` lists every
rule id with its severity and description; `check_raw(raw, …)` judges the text the model generated against
DeepSeek's reference grammar (the "raw-*" rules) and then as the message a faithful parser would make of it; `StreamAccumulator` rebuilds a streamed message so it is judged
whole. `render_calls`/`parse_calls`/`split_completion` write and read the DeepSeek formats (docs/dsml-format.md);
`encode_messages` renders a whole conversation as DeepSeek's reference encoders do (V4, V4.1, V3.2).
"""

from dsml_checker.check import check
from dsml_checker.encoding import encode_messages
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
from dsml_checker.raw import check_raw
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
    "check_raw",
    "encode_messages",
    "parse_calls",
    "render_calls",
    "render_completion",
    "split_completion",
]
