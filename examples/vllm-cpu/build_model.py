"""Build a tiny random-weight Llama with a DeepSeek-style tokenizer, offline, in seconds.

Run with the engine's python (it needs torch, transformers and tokenizers):
    ENGINE_PY examples/vllm-cpu/build_model.py DIR
The model knows nothing: it emits DSML only when a structured-output regex forces it. What it is for
is the real engine around it: vLLM's DeepSeek-V4 tokenizer mode, its tool-call and reasoning parsers,
its streaming detokeniser, its scheduler and prefix cache, its metrics. Idempotent: an existing
complete model (marker written last) is kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
SPECIAL = [BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<｜latest_reminder｜>"]
ADDED = ["<think>", "</think>"]
"""Ordinary added tokens, as in DeepSeek's tokenizer (not special: they stay in decoded text)."""
VERSION = "tiny-dsv4-1"
CORPUS = [
    "Let me check the file first.",
    "I will read the module and then run the tests.",
    "The fix is in; all tests pass now.",
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">\n'
    '<｜DSML｜parameter name="path" string="true">src/cache/pool.py</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    '<｜DSML｜parameter name="limit" string="false">3</｜DSML｜parameter>',
    "def read(path: str) -> str:\n    return open(path).read()\n",
    "<tool_result>ok</tool_result>",
    "You are an autonomous software engineering agent working inside a Python repository.",
    "## Tools\nYou have access to a set of tools you can use to answer the user's question.",
]


def build_tokenizer(out: Path):  # noqa: ANN201 (a transformers PreTrainedTokenizerFast; not imported at module level)
    """Train the DeepSeek-style tokenizer and save it to `out` (needs only tokenizers and transformers).

    Also what the benchmark peers (benchmarks/peers.py) load as their Hugging Face tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 50, trainer)
    tokenizer.add_tokens(ADDED)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=EOS)
    fast.model_max_length = 32768
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def build(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = build_tokenizer(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: vLLM's CPU attention needs at least 32
        num_key_value_heads=2,
        max_position_embeddings=32768,
        bos_token_id=fast.convert_tokens_to_ids(BOS),
        eos_token_id=fast.convert_tokens_to_ids(EOS),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: build_model.py DIR")
    out = Path(sys.argv[1])
    marker = out / ".repro-model"
    if marker.is_file() and marker.read_text() == VERSION:
        return
    build(out)
    marker.write_text(VERSION)


if __name__ == "__main__":
    main()
