"""The model as the protocol core sees it: one chat completion in, text and usage out.

The core never imports an HTTP client; `stream.llm.LLM` implements `Model` over the
openai client, the unit tests' fake implements it in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Completion", "Model"]


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float


class Model(Protocol):
    """Completes one request; raises `stream.errors.LLMError` when it cannot."""

    model: str

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any]
    ) -> Completion: ...
