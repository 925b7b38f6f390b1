"""The model endpoint, reached with the `openai` client over HTTP.

Retriable failures (429, 5xx, connection errors, auth problems an operator must fix)
are retried here, honouring retry-after(-ms), with exponential back-off and jitter. The
caller's batch simply waits, and since the number of batches in flight is bounded,
consumption pauses: an outage never dead-letters the backlog.

A 400 is one of two things. One that names a parameter, the response format or the
schema refuses the request's shape: a configuration error, handled like a wrong key (one
ERROR line, `instanced_stream_llm_refusing`, retried until an operator fixes it), never an
item's fault. Any other 400 (a content filter, a context overflow) depends on what the items
say: it is raised, and the caller splits the request to isolate the item.

Timeouts and 5xx are different again: the same request may never succeed. A request of
several items that timed out, or failed with 5xx `server_attempts` times in a row, is
handed back to the caller, which splits it; one item's is handed back only when the
endpoint answered other requests meanwhile (the item is the problem, not the endpoint).
Every other one is waited out like an outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion

from instanced_stream.core.model import Completion
from instanced_stream.errors import LLMError
from instanced_stream.llm.deadline import Deadline
from instanced_stream.llm.failures import REFUSED, classify
from instanced_stream.llm.options import Collaborators, Recovery, RequestOptions
from instanced_stream.llm.shape import RequestShape
from instanced_stream.observe.telemetry import answered, llm_span
from instanced_stream.retry import RetryPolicy

__all__ = ["LLM", "Completion", "RetryPolicy"]

log = logging.getLogger("instanced_stream.llm")


def _completion(resp: ChatCompletion, started: float) -> Completion:
    choice = resp.choices[0]
    usage = resp.usage
    details = usage.prompt_tokens_details if usage else None
    thought = usage.completion_tokens_details if usage else None
    return Completion(
        text=choice.message.content or "",
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        cached_tokens=(details.cached_tokens or 0) if details else 0,
        latency_s=time.perf_counter() - started,
        # Part of completion_tokens (billed as output), reported apart by reasoning
        # models: how much of the output budget went on thinking.
        reasoning_tokens=(thought.reasoning_tokens or 0) if thought else 0,
    )


def _client(
    base_url: str, api_key: str, timeout_s: float, api_version: str | None, http: Any
) -> openai.AsyncOpenAI:
    # max_retries=0: our own retry loop, not the client's: it must never give up on an outage.
    extra = {"http_client": http} if http is not None else {}
    if api_version is not None:
        # Azure OpenAI: the deployment (our model name) goes in the path, the api-version
        # in the query, the key in an api-key header; its own client does all that.
        return openai.AsyncAzureOpenAI(
            azure_endpoint=base_url,
            api_version=api_version,
            api_key=api_key,
            timeout=timeout_s,
            max_retries=0,
            **extra,
        )
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0, **extra
    )


def _alternative(shape: RequestShape, exc: LLMError) -> RequestShape | None:
    said = str(exc.data.get("said") or exc.message)
    return shape.instead(exc.data.get("param"), exc.data.get("code"), said)


def _say_refused(exc: LLMError, shape: RequestShape, model: str) -> None:
    if exc.shape:
        log.error(
            "the model endpoint refuses the request's shape (%s): %s; consumption is paused, "
            "nothing is dead-lettered: set model.request in the spec to a shape %r accepts, "
            "or remove it so the start-up probe finds one",
            shape.label(),
            exc.message,
            model,
        )
    else:
        log.error(
            "the model endpoint refuses our requests (%s); consumption is paused until it "
            "answers: check the API key, model.name (%r) and the endpoint URL",
            exc.message,
            model,
        )


class LLM:
    """One model endpoint's client: the four required arguments say which endpoint,
    `request`, `recovery` and `collaborators` (llm/options.py) the rest, each defaulted."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float,
        request: RequestOptions | None = None,
        recovery: Recovery | None = None,
        collaborators: Collaborators | None = None,
    ) -> None:
        self.model = model
        self.request = request or RequestOptions()  # replaced when its shape is switched
        self.recovery = recovery or Recovery()
        self.collaborators = collaborators or Collaborators()
        # A harmless one-item request (`instanced_stream.llm.preflight.canary`): asked when one
        # item's request keeps failing with 5xx and nothing else was answered meanwhile.
        self.canary: Callable[[], Awaitable[object]] | None = None
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.deadline = Deadline(timeout_s)
        self.retries = 0
        self.failing = 0  # consecutive retriable failures: the circuit is open while > 2
        # An ongoing refusal (401/403/404, or a 400 naming the request's shape): its status
        # and what was refused, so it is said once, not once per retry.
        self.refused: int | None = None
        self._refusal: tuple[int | None, str | None] | None = None
        self.last_answer = 0.0  # monotonic time of the latest answer: is it answering?
        if self.collaborators.listener is not None:
            self.collaborators.listener.on_shape(self.shape.labels())
        http_client = self.collaborators.http_client
        if http_client is None and self.collaborators.pacer is not None:
            # The SDK's own HTTP client, with a hook that shows the pacer every answer's
            # headers (429s included).
            http_client = openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._headers]})
        self.client = _client(base_url, api_key, timeout_s, self.request.api_version, http_client)

    @property
    def shape(self) -> RequestShape:
        """The shape every request is built in: the request options', switched after a
        refusal (`Recovery.adapt`) or by the start-up probe."""
        return self.request.shape

    @shape.setter
    def shape(self, shape: RequestShape) -> None:
        self.request = replace(self.request, shape=shape)

    async def close(self) -> None:
        await self.client.close()

    async def _headers(self, response: Any) -> None:
        if self.collaborators.pacer is not None:
            self.collaborators.pacer.observe(response.headers)

    async def complete_once(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        max_tokens: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> Completion:
        started = time.perf_counter()
        # The client's generic `post` (the SDK's documented way to any endpoint), not
        # `chat.completions.create`: that walks its forty typed parameters and a typed
        # `response_format` on every request and changes nothing in them, 8% of the
        # processor's time with a fast model. The wire body is the same.
        request = self.request
        cap = request.cap(max_tokens)
        body = request.body(self.model, messages, response_format, cap)
        pacer = self.collaborators.pacer
        if pacer is not None:
            # What the request may spend: its prompt (about 4 characters a token) and cap.
            await pacer.wait(sum(len(m["content"]) for m in messages) // 4 + (cap or 0))
            started = time.perf_counter()  # the endpoint's latency, not the budget's wait
        with llm_span(self.model, self.base_url, request.provider) as span:
            try:
                resp = await self.client.post(
                    "/chat/completions",
                    body=body,
                    cast_to=ChatCompletion,
                    # The deadline follows what it may write here (llm/deadline.py).
                    options=cast(
                        Any,
                        {"timeout": self.deadline.timeout_for(cap)}
                        | ({"headers": headers} if headers else {}),
                    ),
                )
            except Exception as exc:  # every failure is classified, none escapes raw
                raise classify(exc) from exc
            if not resp.choices:
                raise LLMError("LLM answered without choices", retriable=True)
            done = _completion(resp, started)
            answered(span, resp.model, done)
        return done

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion:
        """Completes a request of `items` instances, retrying retriable failures without
        limit. Raises the others, and timeouts and 5xx the caller can act on (see the
        module); `since`: see `instanced_stream.core.model.Model`."""
        attempt, server_failures, sent = 0, 0, time.monotonic()
        while True:
            try:
                done = await self.complete_once(messages, response_format, max_tokens)
            except LLMError as exc:
                if not exc.retriable:
                    raise
                self._failed(exc, items)
                # Split like a timeout; a lone item only while the endpoint answers others
                # (since its request was sent, or since the request it was split from
                # failed: the halves of a batch are asked one after the other).
                elsewhere = items > 1 or self.last_answer > min(sent, since or sent)
                if exc.timeout and elsewhere:
                    raise
                server_failures = server_failures + 1 if (exc.status or 0) >= 500 else 0
                if server_failures >= self.recovery.server_attempts and not elsewhere:
                    elsewhere = await self._answers_others()
                if server_failures >= self.recovery.server_attempts and elsewhere:
                    raise LLMError(
                        f"{exc.message} ({server_failures} attempts)",
                        retriable=True,
                        status=exc.status,
                        server=True,
                    ) from exc
                delay = self.recovery.retry.delay(attempt, exc.retry_after)
                attempt += 1
                self.retries += 1
                if exc.shape and self._switched(exc):
                    continue
                if exc.status in REFUSED or exc.shape:
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
        if exc.timeout:
            self.deadline.timed_out()
        limiter, listener = self.collaborators.limiter, self.collaborators.listener
        if limiter is not None:
            if exc.overload:
                limiter.on_overload(exc.retry_after)
            if exc.timeout:
                limiter.on_timeout(items)
        if listener is not None:
            listener.on_retry()
            listener.on_circuit(self.failing > 2)

    async def _answers_others(self) -> bool:
        """Whether the endpoint answers the canary while this request keeps failing with
        5xx: then its items are the problem, not an outage (which is waited out)."""
        if self.canary is None:
            return False
        try:
            await self.canary()
        except LLMError:
            return False
        self.last_answer = time.monotonic()
        return True

    def _switched(self, exc: LLMError) -> bool:
        nxt = _alternative(self.shape, exc) if self.recovery.adapt else None
        if nxt is None:
            return False
        log.warning(
            "endpoint refused %s (%s); now %s", self.shape.label(), exc.message, nxt.label()
        )
        self.shape = nxt
        if self.collaborators.listener is not None:
            self.collaborators.listener.on_shape(nxt.labels())
        return True

    def _refused(self, exc: LLMError, delay: float) -> None:
        # Once per refusal, loud: a warning per retry would hide the one line that matters.
        what = (exc.status, exc.data.get("param") or exc.data.get("code"))
        if self._refusal != what:
            _say_refused(exc, self.shape, self.model)
            if self.collaborators.listener is not None:
                self.collaborators.listener.on_refused(exc.status)
        self._refusal = what
        self.refused = exc.status
        log.debug("endpoint still refusing, next try in %.1fs", delay)

    def _answered(self, done: Completion, items: int) -> None:
        limiter, listener = self.collaborators.limiter, self.collaborators.listener
        self.last_answer = time.monotonic()
        self.deadline.observe(done.completion_tokens, done.latency_s)
        if self.refused is not None:
            log.warning("the model endpoint answers again; consumption resumes")
            self.refused = None
            self._refusal = None
            if listener is not None:
                listener.on_refused(None)
        if limiter is not None:
            limiter.on_success(
                done.latency_s, done.completion_tokens, items, done.latency_s / self.timeout_s
            )
        if listener is not None:
            listener.observe_latency(done.latency_s)
            if self.failing:
                listener.on_circuit(False)
        self.failing = 0
