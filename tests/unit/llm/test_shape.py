"""The request's shape: built from the chosen shape, probed at start against a provider's
rules, pinned into the spec, and forced by the spec's `model.request`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.errors import StreamError
from instanced_stream.llm.options import RequestOptions
from instanced_stream.llm.preflight import probe
from instanced_stream.llm.shape import RequestShape
from instanced_stream.settings import DEFAULT_SPEC

from tests.endpoint import MemoryEndpoint

pytestmark = pytest.mark.timeout(30)

_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "solution", "strict": True, "schema": {"type": "object"}},
}
_MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "[]"}]


def _body(shape: RequestShape, effort: str | None = None) -> dict[str, Any]:
    return shape.body("m", _MESSAGES, _FORMAT, temperature=0.0, cap=100, reasoning_effort=effort)


def test_the_body_follows_the_shape() -> None:
    plain = _body(RequestShape())
    assert plain["max_tokens"] == 100 and plain["temperature"] == 0.0
    assert plain["response_format"]["json_schema"]["strict"] is True
    reasoning = _body(RequestShape(tokens_param="max_completion_tokens", temperature=False), "low")
    assert "max_tokens" not in reasoning and reasoning["max_completion_tokens"] == 100
    assert "temperature" not in reasoning and reasoning["reasoning_effort"] == "low"
    loose = _body(RequestShape(response_format="json_schema"))
    assert loose["response_format"]["json_schema"]["strict"] is False
    assert _body(RequestShape(response_format="json_object"))["response_format"] == {
        "type": "json_object"
    }
    text = _body(RequestShape(response_format="text"))
    assert "response_format" not in text
    # The schema goes after the cached prefix, as the last message.
    assert (
        text["messages"][:2] == _MESSAGES and '{"type":"object"}' in text["messages"][-1]["content"]
    )


def test_each_known_refusal_has_its_alternative() -> None:
    shape = RequestShape()
    said = "Unsupported parameter: 'max_tokens' is not supported with this model."
    shape = shape.instead("max_tokens", "unsupported_parameter", said) or shape
    assert shape.tokens_param == "max_completion_tokens"
    shape = shape.instead("temperature", "unsupported_value", "does not support 0") or shape
    assert not shape.temperature
    order = []
    for _ in range(3):
        nxt = shape.instead("response_format", "invalid_schema", "Invalid schema")
        assert nxt is not None
        shape = nxt
        order.append(shape.response_format)
    assert order == ["json_schema", "json_object", "text"]
    assert shape.instead("response_format", "invalid_schema", "Invalid schema") is None
    assert shape.instead("top_p", "unsupported_parameter", "no") is None
    # A value out of range is the spec's to fix, not a parameter to rename.
    too_large = "max_tokens is too large: 100000. This model supports at most 16384 tokens."
    assert RequestShape().instead("max_tokens", "invalid_value", too_large) is None


async def test_the_probe_finds_what_a_gpt5_model_accepts() -> None:
    endpoint = MemoryEndpoint("openai", model="gpt-5-mini")
    llm = endpoint.llm()
    spec = load_spec(DEFAULT_SPEC)
    probed = await probe(llm, PromptBuilder(spec))
    assert probed.answered
    assert probed.shape.tokens_param == "max_completion_tokens"
    assert not probed.shape.temperature
    assert probed.shape.response_format == "json_schema_strict"
    assert [t.split(":")[0] for t in probed.tried] == [
        "max_tokens, temperature, response_format json_schema_strict",
        "max_completion_tokens, temperature, response_format json_schema_strict",
    ]
    # A one-item batch of the spec's own schema, not a ping.
    last = endpoint.bodies[-1]
    assert last["response_format"]["json_schema"]["strict"] is True
    items = orjson.loads(last["messages"][1]["content"])
    assert len(items) == 1
    pinned = probed.pinned(spec)
    assert pinned.model.request is not None
    assert pinned.model.request.tokens_param == "max_completion_tokens"
    assert pinned.model.request.temperature == "omit"


async def test_a_shape_the_spec_forces_is_reported_not_worked_around() -> None:
    endpoint = MemoryEndpoint("openai", model="gpt-5-mini")
    with pytest.raises(StreamError, match="Use 'max_completion_tokens' instead"):
        await probe(endpoint.llm(), PromptBuilder(load_spec(DEFAULT_SPEC)), adapt=False)
    assert len(endpoint.bodies) == 1


async def test_the_probe_keeps_a_shape_an_older_model_accepts() -> None:
    endpoint = MemoryEndpoint("openai", model="gpt-4o-mini")
    probed = await probe(endpoint.llm(), PromptBuilder(load_spec(DEFAULT_SPEC)))
    assert probed.shape == RequestShape() and not probed.tried


async def test_reasoning_tokens_are_read_and_the_cap_leaves_room_for_them() -> None:
    endpoint = MemoryEndpoint("openai", model="gpt-5-mini")
    llm = endpoint.llm(
        RequestOptions(
            shape=RequestShape(tokens_param="max_completion_tokens", temperature=False),
            reasoning_effort="low",
            reasoning_headroom=500,
        )
    )
    spec = load_spec(DEFAULT_SPEC)
    prompt = PromptBuilder(spec)
    from tests.fakes import make_batch

    done = await llm.complete(
        prompt.messages(make_batch(["hi"])), prompt.response_format(1), max_tokens=300
    )
    assert done.reasoning_tokens == 30 and done.completion_tokens == 70
    sent = endpoint.bodies[-1]
    assert sent["max_completion_tokens"] == 800 and sent["reasoning_effort"] == "low"
    # Output is billed including the reasoning tokens (they are part of completion_tokens).
    priced = spec.model.model_copy(update={"price_output_per_million": 1_000_000.0})
    assert priced.cost_usd(0, done.completion_tokens) == 70.0


async def test_an_unproven_shape_is_switched_mid_stream_and_nothing_is_dead_lettered() -> None:
    """The endpoint did not answer the probe at start (an outage): the first batches
    meet the refusals the probe would have, and switch as it would."""
    from instanced_stream.core.solve import Solver
    from instanced_stream.core.validate import Validator

    from tests.fakes import make_batch

    endpoint = MemoryEndpoint("openai", model="gpt-5-mini")
    llm = endpoint.llm(adapt=True)
    spec = load_spec(DEFAULT_SPEC)
    solver = Solver(llm, PromptBuilder(spec), Validator(spec), 3)
    out = await solver.solve(make_batch(["one", "two", "three"]))
    assert not out.unanswered and len(out.answers) == 3
    assert llm.shape.tokens_param == "max_completion_tokens" and not llm.shape.temperature
    assert len(endpoint.bodies) == 3  # two refused, then answered: no pause, no split
