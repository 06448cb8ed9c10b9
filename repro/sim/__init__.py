"""The embedded DeepSeek-V4 SGLang simulator: an OpenAI-compatible server with a mechanistic HiCache race.

`repro sim serve` (or `python -m repro.sim serve`) runs it; `repro.sim.launch.start_sim` starts it as
a subprocess for the harness and the tests.
"""
