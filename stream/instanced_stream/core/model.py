"""The model as the protocol core sees it: one chat completion in, text and usage out.

The core never imports an HTTP client; `instanced_stream.llm.LLM` implements `Model` over the
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
    reasoning_tokens: int = 0  # of completion_tokens: a reasoning model's hidden thinking


class Model(Protocol):
    """Completes one request of `items` instances; raises `instanced_stream.errors.LLMError` when
    it cannot. A timeout is raised (`LLMError.timeout`) when splitting the request or
    giving up on its one item may help; outages are waited out inside. `since`
    (monotonic seconds): the request is part of one that failed then; an answer given
    after it means the endpoint works and a failing item, not an outage, is at fault.
    `keys`: the asked instances' `Instance.key`s in token order; the batch tier records
    them with each Batch API line, so a restarted processor finds its line again."""

    model: str

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion: ...
