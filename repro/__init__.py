"""repro: reproduce concurrency-dependent tool-call corruption in LLM serving and bisect it to its cause."""

__version__ = "0.1.0"
