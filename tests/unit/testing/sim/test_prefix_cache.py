"""The simulator reports cached prompt tokens by a provider's rule, and counts every
preset's reads and writes for the same requests."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec
from instanced_stream_bench.harness.bench import bench_spec
from instanced_stream_bench.harness.spec_variants import over_minimum, shared_tokens
from instanced_stream_bench.testing.sim.account import SimConfig
from instanced_stream_bench.testing.sim.server import Simulator

from tests.fakes import make_batch


def _body(spec: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    builder = PromptBuilder(AgentSpec.model_validate(spec))
    batch: list[Instance] = make_batch(texts, "p")
    return {
        "model": "stream-sim-1",
        "messages": builder.messages(batch),
        "response_format": builder.response_format(len(batch)),
    }


async def _cached(sim: Simulator, body: dict[str, Any]) -> int:
    response = await sim.respond(body, {}, {})
    assert response.status == 200
    assert isinstance(response.body, bytes)
    usage = orjson.loads(response.body)["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


async def test_a_shared_prefix_under_1024_tokens_is_never_reported_cached() -> None:
    spec = bench_spec()
    assert shared_tokens(spec) < 1024
    sim = Simulator(SimConfig(classifier=False))
    for text in ("first", "second", "third"):
        assert await _cached(sim, _body(spec, [text])) == 0
    # ... while the old rule, any repeat cached, would have credited it every time
    assert sim.stats["cache_read:any-repeat-0.5x"] == 2 * (shared_tokens(spec) + 3)
    assert sim.stats["cache_read:openai-0.1x"] == sim.stats["cache_read:anthropic"] == 0


async def test_a_prefix_over_the_minimum_is_cached_in_128_token_steps_once_seen() -> None:
    spec = over_minimum(bench_spec())
    prefix = shared_tokens(spec) + 3  # the system message and its framing
    assert 1024 < prefix < 1152
    sim = Simulator(SimConfig(classifier=False))
    assert await _cached(sim, _body(spec, ["first"])) == 0  # the first request stores it
    assert await _cached(sim, _body(spec, ["second", "third"])) == 1024
    assert sim.stats["cache_written:anthropic"] == prefix  # the breakpoint's one write
    assert sim.stats["cache_read:anthropic"] == prefix
    assert sim.stats["cache_written:openai-0.1x"] == 0


@pytest.mark.parametrize("preset", ["anthropic", "any-repeat-0.5x"])
async def test_the_reported_cache_follows_the_configured_rule(preset: str) -> None:
    spec = over_minimum(bench_spec())
    sim = Simulator(SimConfig(classifier=False, cache=preset))
    await _cached(sim, _body(spec, ["first"]))
    assert await _cached(sim, _body(spec, ["second"])) == shared_tokens(spec) + 3
