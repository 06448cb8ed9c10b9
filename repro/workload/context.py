"""Each session's own long prefix: a deterministic project document that opens its conversation.

Sized by `context_tokens` (a workload field, or `repro run --pressure`): at about 4 characters per token,
text of common English words, unique per (seed, session) so that no two sessions share a page of it
beyond the system prompt. Every later turn resends it byte for byte, so a server must either keep it on
the GPU, load it back from its host tier, or compute it again.
"""

from __future__ import annotations

import random

CHARS_PER_TOKEN = 4
"""An estimate for English text with a BPE tokenizer; the simulator uses the same."""

_WORDS = (
    "the module reads its configuration from the store and writes each record after the check passes "
    "a request carries the session identifier the cache key and the deadline of the caller while the "
    "scheduler keeps a queue per worker and retries a batch when the lease expires before the commit "
    "every index is rebuilt from the journal on start so that a crash never loses an acknowledged write "
    "tests cover the parser the planner the allocator and the network client with fixtures on disk"
).split()


def context_document(session_id: int, seed: int, tokens: int) -> str:
    """About `tokens` tokens of prose, the same for the same (session, seed), different for any other."""
    rng = random.Random(f"context-{seed}-{session_id}")
    header = f"Project notes for ticket REPRO-{seed}-{session_id:04d} (background for the task that follows).\n\n"
    target = max(0, tokens * CHARS_PER_TOKEN - len(header))
    parts: list[str] = []
    size = 0
    line = 0
    while size < target:
        line += 1
        sentence = f"{line}. " + " ".join(rng.choices(_WORDS, k=14)) + ".\n"
        parts.append(sentence)
        size += len(sentence)
    return header + "".join(parts)
