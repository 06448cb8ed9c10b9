"""dsml_checker: decide whether a model's turn is clean or carries broken DeepSeek DSML tool-call markup."""

from dsml_checker.formats import (
    Completion,
    DSMLParseError,
    ToolCall,
    parse_calls,
    render_calls,
    render_completion,
    split_completion,
)

__all__ = [
    "Completion",
    "DSMLParseError",
    "ToolCall",
    "parse_calls",
    "render_calls",
    "render_completion",
    "split_completion",
]
