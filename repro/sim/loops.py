"""The model's own loops: DeepSeek-V4 repeats itself on some long contexts at any load, even on its
official API. With `--model-loop-rate R` the simulated model does too: on a share R of the long
prompts (`--model-loop-after-turns` assistant turns or more) it writes a short reasoning, then one
span over and over until max_tokens cuts it (finish_reason "length", no tool call).

Which turns loop is drawn from the seed, the conversation's identity and the turn number only, never
from timing or the server's configuration: the same turns loop at concurrency 1 and under load, with
the race on or off. That is what a control arm must find: a failure the control shares is the model's.
"""

from __future__ import annotations

from typing import Any

from dsml_checker.formats import render_completion
from repro.sim.config import SimConfig
from repro.sim.model import Answer, assistant_turns, conversation_key, rng_for

LOOP_SPAN = "again, "
"""The repeated span: short enough for the checker's repetition-loop rule (units up to 8 bytes)."""
UNLIMITED_TOKENS = 4096
"""How long a loop runs when the request sets no max_tokens (a server's own cap stops it there)."""


def loops(config: SimConfig, messages: list[dict[str, Any]], seed: int) -> bool:
    """Whether the model loops on this prompt: a long one, drawn at `model_loop_rate` by conversation and turn."""
    turn = assistant_turns(messages)
    if config.model_loop_rate <= 0 or turn < config.model_loop_after_turns:
        return False
    return rng_for(seed, conversation_key(messages), turn, "model-loop").random() < config.model_loop_rate


def looping_answer(token_limit: int | None, chars_per_token: int) -> Answer:
    """A short reasoning, then the span repeated past the token limit (the server's cut ends it)."""
    reasoning = "The output so far needs one more check before the next step."
    room = (token_limit or UNLIMITED_TOKENS) * chars_per_token
    content = LOOP_SPAN * (room // len(LOOP_SPAN) + 2)
    return Answer(reasoning, content, (), render_completion(reasoning=reasoning, content=content, calls=[], fmt="v4"))
