"""Writes examples/log.jsonl: a request/response log, as a gateway logs it, of the conversations in
examples/traces.jsonl, which `repro trace convert` rebuilds (docs/replay.md).

Each assistant turn of each conversation becomes one call: the request body (the history before the
turn, the tools and settings) and the chat.completion answer (created: the turn's timestamp). The calls
of the four conversations are interleaved in a shuffled order, as a busy gateway would log them.
Run from the repository root: `python examples/make_log.py 5 examples/log.jsonl` (the first 5 turns each).
"""

import datetime
import json
import random
import sys

TURNS, OUT = int(sys.argv[1]), sys.argv[2]


def seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


calls = []
for line in open("examples/traces.jsonl", encoding="utf-8"):
    conversation = json.loads(line)
    sent = [{k: v for k, v in m.items() if k != "timestamp"} for m in conversation["messages"]]
    answers = [i for i, m in enumerate(sent) if m["role"] == "assistant"][:TURNS]
    for n, i in enumerate(answers):
        created = seconds(conversation["messages"][i]["timestamp"])
        request = {"model": "deepseek-v4", "messages": sent[:i], "tools": conversation["tools"],
                   "tool_choice": conversation["tool_choice"], "max_tokens": conversation["max_tokens"]}
        response = {"id": f"chatcmpl-{conversation['id']}-{n}", "object": "chat.completion", "created": int(created),
                    "choices": [{"index": 0, "message": sent[i],
                                 "finish_reason": "tool_calls" if sent[i].get("tool_calls") else "stop"}]}
        calls.append({"request": request, "response": response, "timestamp": created})
random.Random(4).shuffle(calls)
with open(OUT, "w", encoding="utf-8") as fh:
    fh.writelines(json.dumps(call, ensure_ascii=False) + "\n" for call in calls)
