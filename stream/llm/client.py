"""The model endpoint, reached with the `openai` client over HTTP.

Retriable failures (429, 5xx, timeouts, connection errors, auth problems an operator must
fix) are retried here for as long as they last, honouring retry-after, with exponential
back-off and jitter. The caller's batch simply waits, and since the number of batches in
flight is bounded, consumption pauses: an outage never dead-letters the backlog.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

import openai

from stream.core.model import Completion
from stream.errors import LLMError
from stream.llm.limiter import Limiter

__all__ = ["LLM", "Completion", "Listener", "RetryPolicy"]

log = logging.getLogger("stream.llm")


class Listener(Protocol):
    """Told of every answer, retry and circuit change (the processor's metrics)."""

    def observe_latency(self, seconds: float) -> None: ...
    def on_retry(self) -> None: ...
    def on_circuit(self, is_open: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 0.25
    cap_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        # Full jitter keeps many workers from hammering a recovering endpoint in step.
        backoff = random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))
        if retry_after is not None:
            return min(self.cap_s, max(retry_after, 0.0)) + backoff * 0.1
        return backoff


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _classify(exc: Exception) -> LLMError:
    if isinstance(exc, openai.APITimeoutError):
        return LLMError("LLM request timed out", retriable=True, timeout=True)
    if isinstance(exc, openai.APIConnectionError):
        return LLMError(f"LLM endpoint unreachable: {exc}", retriable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        # 401/403/404 mean a wrong key, model or URL: an operator fixes those, and the
        # items must still be there when they do.
        retriable = status in (401, 403, 404, 408, 409, 429) or status >= 500
        return LLMError(
            f"LLM endpoint answered {status}: {exc.message}",
            retriable=retriable,
            status=status,
            retry_after=_retry_after(exc),
        )
    # Unknown failures pause the stream rather than dead-letter the backlog: waiting is
    # safe, and an operator sees the warnings.
    return LLMError(f"LLM call failed: {exc!r}", retriable=True)


class LLM:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float,
        temperature: float = 0.0,
        max_output_tokens: int | None = None,
        retry: RetryPolicy | None = None,
        listener: Listener | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.retries = 0
        self.failing = 0  # consecutive retriable failures: the circuit is open while > 2
        self.listener = listener
        self.limiter = limiter  # told of every answer and every refusal
        # Our own retry loop, not the client's: it must never give up on an outage.
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
        )

    async def close(self) -> None:
        await self.client.close()

    async def complete_once(
        self, messages: list[dict[str, str]], response_format: dict[str, Any]
    ) -> Completion:
        started = time.perf_counter()
        # Built as a plain dict: the SDK's typed overloads cannot express a schema we
        # generate at run time.
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "response_format": response_format,
            "temperature": self.temperature,
        }
        if self.max_output_tokens is not None:
            request["max_tokens"] = self.max_output_tokens
        try:
            resp = await self.client.chat.completions.create(**request)
        except Exception as exc:  # every failure is classified, none escapes raw
            raise _classify(exc) from exc
        if not resp.choices:
            raise LLMError("LLM answered without choices", retriable=True)
        choice = resp.choices[0]
        usage = resp.usage
        details = usage.prompt_tokens_details if usage else None
        return Completion(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=(details.cached_tokens or 0) if details else 0,
            latency_s=time.perf_counter() - started,
        )

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any]
    ) -> Completion:
        """Completes, retrying retriable failures without limit; raises the others."""
        attempt = 0
        while True:
            try:
                done = await self.complete_once(messages, response_format)
            except LLMError as exc:
                if not exc.retriable:
                    raise
                self.failing += 1
                if self.limiter is not None and exc.overload:
                    self.limiter.on_overload(exc.retry_after)
                if self.listener is not None:
                    self.listener.on_retry()
                    self.listener.on_circuit(self.failing > 2)
                delay = self.retry.delay(attempt, exc.retry_after)
                attempt += 1
                self.retries += 1
                log.warning(
                    "LLM retriable failure, retry %d in %.2fs: %s", attempt, delay, exc.message
                )
                await asyncio.sleep(delay)
                continue
            if self.limiter is not None:
                self.limiter.on_success(done.latency_s, done.completion_tokens)
            if self.listener is not None:
                self.listener.observe_latency(done.latency_s)
                if self.failing:
                    self.listener.on_circuit(False)
            self.failing = 0
            return done
