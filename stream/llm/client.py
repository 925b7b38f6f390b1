"""The model endpoint, reached with the `openai` client over HTTP.

Retriable failures (429, 5xx, connection errors, auth problems an operator must fix)
are retried here for as long as they last, honouring retry-after, with exponential
back-off and jitter. The caller's batch simply waits, and since the number of batches in
flight is bounded, consumption pauses: an outage never dead-letters the backlog.

Timeouts are different: the same request may never fit in the time allowed. A request
of several items that timed out is handed back to the caller, which splits it; one
item's timeout is handed back only when the endpoint answered other requests meanwhile
(the item is the problem, not the endpoint). Every other timeout is waited out like an
outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import openai
from openai.types.chat import ChatCompletion

from stream.core.model import Completion
from stream.errors import LLMError
from stream.llm.limiter import Limiter
from stream.retry import RetryPolicy

__all__ = ["LLM", "Completion", "Listener", "RetryPolicy"]

log = logging.getLogger("stream.llm")


class Listener(Protocol):
    """Told of every answer, retry and circuit change (the processor's metrics)."""

    def observe_latency(self, seconds: float) -> None: ...
    def on_retry(self) -> None: ...
    def on_circuit(self, is_open: bool) -> None: ...
    def on_refused(self, status: int | None) -> None: ...


# A wrong key (401), a key without access (403), an unknown model or URL (404): retrying
# cannot fix these, an operator must. The stream pauses until then, and says so.
REFUSED = (401, 403, 404)


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
        retriable = status in (*REFUSED, 408, 409, 429) or status >= 500
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
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.retries = 0
        self.failing = 0  # consecutive retriable failures: the circuit is open while > 2
        self.refused: int | None = None  # the status of an ongoing refusal (401/403/404)
        self.last_answer = 0.0  # monotonic time of the latest answer: is it answering?
        self.listener = listener
        self.limiter = limiter  # told of every answer and every refusal
        # Our own retry loop, not the client's: it must never give up on an outage.
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
        )

    async def close(self) -> None:
        await self.client.close()

    async def complete_once(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        max_tokens: int | None = None,
    ) -> Completion:
        started = time.perf_counter()
        # The client's generic `post` (the SDK's documented way to any endpoint), not
        # `chat.completions.create`: that walks its forty typed parameters and a typed
        # `response_format` on every request and changes nothing in them, 8% of the
        # processor's time with a fast model. The wire body is the same.
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "response_format": response_format,
        }
        caps = [c for c in (self.max_output_tokens, max_tokens) if c is not None]
        if caps:
            body["max_tokens"] = min(caps)
        try:
            resp = await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)
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
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
    ) -> Completion:
        """Completes a request of `items` instances, retrying retriable failures without
        limit. Raises the others, and timeouts the caller can act on (see the module)."""
        attempt = 0
        sent = time.monotonic()
        while True:
            try:
                done = await self.complete_once(messages, response_format, max_tokens)
            except LLMError as exc:
                if not exc.retriable:
                    raise
                self._failed(exc, items)
                if exc.timeout and (items > 1 or self.last_answer > sent):
                    raise
                delay = self.retry.delay(attempt, exc.retry_after)
                attempt += 1
                self.retries += 1
                if exc.status in REFUSED:
                    self._refused(exc, delay)
                else:
                    log.warning(
                        "LLM retriable failure, retry %d in %.2fs: %s",
                        attempt,
                        delay,
                        exc.message,
                    )
                await asyncio.sleep(delay)
                continue
            self._answered(done, items)
            return done

    def _failed(self, exc: LLMError, items: int) -> None:
        self.failing += 1
        if self.limiter is not None:
            if exc.overload:
                self.limiter.on_overload(exc.retry_after)
            if exc.timeout:
                self.limiter.on_timeout(items)
        if self.listener is not None:
            self.listener.on_retry()
            self.listener.on_circuit(self.failing > 2)

    def _refused(self, exc: LLMError, delay: float) -> None:
        # Once per refusal, loud: a warning per retry would hide the one line that matters.
        if self.refused != exc.status:
            log.error(
                "the model endpoint refuses our requests (%s); consumption is paused until "
                "it answers: check the API key, model.name (%r) and the endpoint URL",
                exc.message,
                self.model,
            )
            if self.listener is not None:
                self.listener.on_refused(exc.status)
        self.refused = exc.status
        log.debug("endpoint still refusing, next try in %.1fs", delay)

    def _answered(self, done: Completion, items: int) -> None:
        self.last_answer = time.monotonic()
        if self.refused is not None:
            log.warning("the model endpoint answers again; consumption resumes")
            self.refused = None
            if self.listener is not None:
                self.listener.on_refused(None)
        if self.limiter is not None:
            self.limiter.on_success(
                done.latency_s, done.completion_tokens, items, done.latency_s / self.timeout_s
            )
        if self.listener is not None:
            self.listener.observe_latency(done.latency_s)
            if self.failing:
                self.listener.on_circuit(False)
        self.failing = 0

    async def check(self) -> None:
        """One tiny request: raises LLMError(status 401/403/404) when the endpoint refuses
        the key or does not know the model. Other failures are left to the stream."""
        try:
            await self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "Answer with OK."}],
                max_tokens=1,
            )
        except openai.APIStatusError as exc:
            if exc.status_code in REFUSED:
                raise _classify(exc) from exc
        except openai.OpenAIError:
            return  # unreachable or slow: an outage, which the stream waits out
