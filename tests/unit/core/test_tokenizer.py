"""Prompt token counts: exact with tiktoken for known models, an approximation for others."""

from __future__ import annotations

from instanced_stream.core.tokenizer import Tokenizer, estimate_tokens


def test_tiktoken_counts_exactly_for_known_models_and_approximates_others() -> None:
    exact = Tokenizer("gpt-4")
    assert exact.exact and exact.method == "tiktoken cl100k_base"
    assert exact.count("hello world") == 2
    other = Tokenizer("stream-sim-1")
    assert not other.exact and "approximation" in other.method
    # Non-English text costs far more tokens per byte than the 4-bytes rule assumes.
    text = "数据流处理" * 40
    assert other.count(text) > estimate_tokens(len(text.encode())) / 2
    assert estimate_tokens("hello world", "gpt-4") == 2
