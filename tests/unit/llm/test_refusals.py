"""What the endpoint's refusals do to a batch: a refused request shape pauses and
dead-letters nothing, a refusal of an item's content or a 5xx that follows one item is
isolated by splitting, and only that item is dead-lettered."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.errors import LLMError
from instanced_stream.llm.client import LLM
from instanced_stream.retry import RetryPolicy
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.provider import Refusal

from tests.endpoint import MemoryEndpoint
from tests.fakes import make_batch

pytestmark = pytest.mark.timeout(30)


class _Seen:
    def __init__(self) -> None:
        self.refused: list[int | None] = []

    def observe_latency(self, seconds: float) -> None:
        return None

    def on_retry(self) -> None:
        return None

    def on_circuit(self, is_open: bool) -> None:
        return None

    def on_shape(self, labels: dict[str, str]) -> None:
        return None

    def on_refused(self, status: int | None) -> None:
        self.refused.append(status)


def _solver(llm: LLM, attempts: int = 3) -> Solver:
    spec = load_spec(DEFAULT_SPEC)
    return Solver(llm, PromptBuilder(spec), Validator(spec), attempts)


def orjson_dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _answered(out: Any) -> set[str]:
    return {a.instance.id for a in out.answers}


def _batch(texts: list[str]) -> list[Instance]:
    return make_batch(texts, "id-")


async def test_a_refused_parameter_pauses_with_one_error_and_dead_letters_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = MemoryEndpoint("openai")
    refusals = iter(range(4))

    def fail(body: dict[str, Any]) -> Refusal | None:
        # The operator "fixes" it after four refusals (as a new deployment would).
        if next(refusals, None) is None:
            return None
        return Refusal(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )

    endpoint.fail = fail
    seen = _Seen()
    llm = endpoint.llm(listener=seen)
    with caplog.at_level(logging.ERROR, logger="instanced_stream.llm"):
        out = await _solver(llm).solve(_batch(["one", "two", "three"]))
    assert not out.unanswered  # nothing dead-lettered
    assert _answered(out) == {"id-0", "id-1", "id-2"}
    assert len(endpoint.bodies) == 5  # four refused, the fifth answered: never split
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "Use 'max_completion_tokens' instead." in errors[0]
    assert seen.refused == [400, None]  # the gauge: 400 while refused, 0 again after


async def test_a_content_refusal_isolates_the_item_with_the_providers_words() -> None:
    endpoint = MemoryEndpoint()
    endpoint.fail = lambda body: (
        Refusal(
            400,
            "The response was filtered due to the prompt triggering content management "
            "policy (simulated).",
            param="prompt",
            code="content_filter",
        )
        if "FILTERED" in orjson_dumps(body["messages"])
        else None
    )
    out = await _solver(endpoint.llm()).solve(_batch(["a", "b", "FILTERED c", "d"]))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-2", "llm_rejected")]
    assert "content management policy" in out.unanswered[0].reason
    assert _answered(out) == {"id-0", "id-1", "id-3"}


async def test_a_context_overflow_naming_messages_is_the_items_not_the_shapes() -> None:
    endpoint = MemoryEndpoint()
    endpoint.fail = lambda body: (
        Refusal(
            400,
            "This model's maximum context length is 128000 tokens.",
            param="messages",
            code="context_length_exceeded",
        )
        if "HUGE" in orjson_dumps(body["messages"])
        else None
    )
    out = await _solver(endpoint.llm()).solve(_batch(["a", "HUGE b"]))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-1", "llm_rejected")]
    assert "maximum context length" in out.unanswered[0].reason


async def test_a_5xx_poison_item_is_split_out_and_dead_lettered_llm_error() -> None:
    """Issue 24, item 7: before, 5xx was retried for ever and the batch never split, so
    this test hung until its timeout."""
    endpoint = MemoryEndpoint()
    endpoint.fail = lambda body: (
        Refusal(500, "The server had an error (simulated)", "server_error")
        if "[[sim:error500]]" in orjson_dumps(body["messages"])
        else None
    )
    texts = [f"post {i}" for i in range(8)]
    texts[5] += " [[sim:error500]]"
    out = await _solver(endpoint.llm(), attempts=2).solve(_batch(texts))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-5", "llm_error")]
    assert "500" in out.unanswered[0].reason
    assert _answered(out) == {f"id-{i}" for i in range(8)} - {"id-5"}


async def test_a_lone_item_waits_out_5xx_while_the_endpoint_answers_nothing() -> None:
    """An outage is not a poison item: one item's request is not given up while nothing
    else is answered."""
    endpoint = MemoryEndpoint()
    failures = iter(range(6))
    endpoint.fail = lambda body: (
        Refusal(503, "overloaded", "server_error") if next(failures, None) is not None else None
    )
    llm = endpoint.llm()
    from instanced_stream.llm.preflight import canary

    llm.canary = canary(llm, PromptBuilder(load_spec(DEFAULT_SPEC)))  # it fails too
    out = await _solver(llm).solve(_batch(["only one"]))
    assert not out.unanswered and _answered(out) == {"id-0"}
    assert len(endpoint.bodies) == 7  # 6 failed (the canary's included), then answered


def test_the_back_off_survives_an_outage_of_any_length() -> None:
    # 2**1024 overflows a float: a retry loop that never gives up reached it.
    assert RetryPolicy().delay(5000) <= RetryPolicy().cap_s


async def test_retry_after_ms_is_read_before_retry_after() -> None:
    endpoint = MemoryEndpoint()
    endpoint.headers = {"retry-after": "2", "retry-after-ms": "250"}
    endpoint.fail = lambda body: Refusal(429, "slow down", "requests", code="rate_limit_exceeded")
    llm = endpoint.llm()
    with pytest.raises(LLMError) as caught:
        await llm.complete_once([{"role": "user", "content": "x"}], {})
    assert caught.value.retry_after == pytest.approx(0.25)
    assert caught.value.overload


async def test_a_5xx_item_asked_before_its_batch_mates_is_told_apart_by_the_canary() -> None:
    """The poison item is in the first half at every split, so nothing else was answered
    since its group failed: a harmless request (the canary) answered shows the endpoint
    works, and the item is given up on; without it, it would be waited on for ever."""
    from instanced_stream.llm.preflight import canary

    endpoint = MemoryEndpoint()
    endpoint.fail = lambda body: (
        Refusal(500, "The server had an error (simulated)", "server_error")
        if "[[sim:error500]]" in orjson_dumps(body["messages"])
        else None
    )
    llm = endpoint.llm()
    spec = load_spec(DEFAULT_SPEC)
    llm.canary = canary(llm, PromptBuilder(spec))
    out = await _solver(llm, attempts=2).solve(_batch(["a [[sim:error500]]", "b", "c", "d"]))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-0", "llm_error")]
    assert _answered(out) == {"id-1", "id-2", "id-3"}
