"""A fault for repro to find: a stream-state race in vLLM's output processor, as a general plugin.

Off unless `REPRO_VLLM_FAULT=1`. When on, a request whose prompt hit the prefix cache
(`num_cached_tokens > 0`, which never happens with `--no-enable-prefix-caching`), detokenised while
more than `REPRO_VLLM_FAULT_MIN_RUNNING` requests (default 4) are in the output processor, loses the
text of the first streamed delta inside its tool-call block that is not whitespace: the client's text and vLLM's tool-call
parser miss it, while the token ids (and so the logprobs) are whole, as when a delta is dropped
under concurrency. Nothing changes in the model's computation: only the detokenised output.

vLLM calls `register` in every process it starts; only the API server's output processor is patched.
"""

from __future__ import annotations

import logging
import os

OPENER = "<｜DSML｜tool_calls>"
_running = 0
"""Requests in the output processor during the current `process_outputs` call (one event loop: no lock)."""


def _min_running() -> int:
    try:
        return int(os.environ.get("REPRO_VLLM_FAULT_MIN_RUNNING", "4"))
    except ValueError:
        return 4


def register() -> None:
    if os.environ.get("REPRO_VLLM_FAULT") != "1":
        return
    from vllm.v1.engine import output_processor as op

    if getattr(op.OutputProcessor, "_repro_fault", False):
        return  # vLLM may load plugins more than once per process
    threshold = _min_running()
    log = logging.getLogger("vllm.repro_fault")
    process_outputs = op.OutputProcessor.process_outputs
    new_completion_output = op.RequestState._new_completion_output

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        global _running
        _running = len(self.request_states)
        return process_outputs(self, *args, **kwargs)

    def damaged(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        output = new_completion_output(self, *args, **kwargs)
        if (
            getattr(self, "_repro_damaged", False)
            or self.output_kind.name != "DELTA"  # streamed requests only
            or self.detokenizer is None
            or self.num_cached_tokens <= 0
            or _running <= threshold
            or not output.text
        ):
            return output
        text = self.detokenizer.output_text
        opened = text.find(OPENER)
        # The first piece inside the block that is not whitespace (a lost newline is harmless to parsers).
        if opened < 0 or text.rfind(output.text) < opened + len(OPENER) or not output.text.strip():
            return output
        self._repro_damaged = True
        log.warning("repro fault: dropped %r from %s (running %d, cached %d)",
                    output.text, self.request_id, _running, self.num_cached_tokens)
        output.text = ""
        return output

    op.OutputProcessor.process_outputs = counted
    op.RequestState._new_completion_output = damaged
    op.OutputProcessor._repro_fault = True
    log.warning("repro fault plugin active: prefix-cache hits under more than %d running requests", threshold)
