"""Writes examples/traces.jsonl: four synthetic coding-agent conversations in the trace format.

They are built, not recorded: the default workload's system prompt and tools, tool results from the
harness's sandbox, 15 assistant turns each (14 tool calls, then a final answer) with timestamps a few
seconds apart. Long enough that replaying them at 60 sessions engages the simulator's HiCache race.
Run from the repository root: `python examples/make_traces.py 14 examples/traces.jsonl`.
"""

import json, yaml, datetime, sys
from repro.workload.scenario import Workload
from repro.workload import sandbox
w = Workload.model_validate(yaml.safe_load(open("experiments/agentic_coding.yaml")))
tools = w.openai_tools()
files = ["src/cache/eviction.py", "src/cache/pages.py", "src/stream/writer.py", "src/parser/dsml.py", "src/index/buffers.py",
         "src/layer/copy.py", "src/session/state.py", "tests/cache/test_eviction.py", "src/cache/radix.py", "src/layer/engine.py"]
plans = [
 ("fix-eviction-order", "The prefix cache evicts the most recently used page first under memory pressure. Find out why and fix it.",
  "The eviction heap was popped from the wrong end, so the newest page went first. Popping from the left restores LRU order; tests pass."),
 ("stream-writer-flush", "The streaming response writer sometimes drops the last chunk when the client disconnects. Investigate.",
  "The writer returns before awaiting the final flush when the disconnect arrives first; the final chunk is now written before the close check."),
 ("parser-quotes", "Tool-call arguments with typographic quotes are rejected by the parser. Make it accept them or give a clear error.",
  "Typographic quotes are not valid attribute delimiters; the parser now reports which parameter used one instead of a generic failure."),
 ("index-buffer-size", "The sparse-attention indexer allocates twice the buffer it needs for bf16 keys. Find the allocation.",
  "The allocation multiplied the item size by two although bf16 keys are already two bytes each; the buffer is now half the size."),
]
N = int(sys.argv[1])
t0 = datetime.datetime(2026, 5, 4, 9, 30, 0, tzinfo=datetime.timezone.utc)
lines = []
for n, (cid, task, final) in enumerate(plans):
    calls = [("list_dir", {"path": "src"}), ("grep", {"pattern": cid.split("-")[0], "path": "src"})]
    calls += [("read_file", {"path": files[(n + k) % len(files)]}) for k in range(N - 4)]
    calls += [("edit_file", {"path": files[n], "old": "return None", "new": "return self"}), ("run_tests", {"target": "tests"})]
    t = t0 + datetime.timedelta(seconds=37 * n)
    stamp = lambda: t.isoformat().replace("+00:00", "Z")
    msgs = [{"role": "system", "content": w.system_prompt}, {"role": "user", "content": task, "timestamp": stamp()}]
    for i, (name, args) in enumerate(calls):
        t += datetime.timedelta(seconds=2.5 + (i * 7 + n * 3) % 5)
        call_id = f"call_{cid}_{i}"
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}], "timestamp": stamp()})
        t += datetime.timedelta(seconds=0.4)
        msgs.append({"role": "tool", "tool_call_id": call_id, "content": sandbox.execute(w, name, json.dumps(args)), "timestamp": stamp()})
    t += datetime.timedelta(seconds=3.1)
    msgs.append({"role": "assistant", "content": final, "timestamp": stamp()})
    lines.append(json.dumps({"id": cid, "tools": tools, "tool_choice": "auto", "max_tokens": 1024, "messages": msgs}, ensure_ascii=False))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
