"""The simulator as an account: latency per output token, concurrency and TPM limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.server import SimConfig, Simulator

from tests.fakes import make_batch


def _body(n: int = 3) -> dict[str, Any]:
    builder = PromptBuilder(load_spec(DEFAULT_SPEC))
    texts = [f"Thanks for the write-up number {i}." for i in range(n)]
    return {"model": "stream-sim-1", "messages": builder.messages(make_batch(texts))}


async def _client(config: SimConfig) -> tuple[Simulator, TestClient[Any, Any]]:
    sim = Simulator(config)
    sim.toxicity(["warm up"])  # load the classifier before anything is timed
    client: TestClient[Any, Any] = TestClient(TestServer(sim.app()))
    await client.start_server()
    return sim, client


async def test_latency_is_a_fixed_part_plus_a_part_per_output_token() -> None:
    _, client = await _client(SimConfig(latency_ms=100, per_output_token_ms=2))
    try:
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json=_body())
        elapsed_ms = (time.monotonic() - started) * 1000
        usage = (await resp.json())["usage"]
    finally:
        await client.close()
    assert resp.status == 200
    expected = 100 + 2 * usage["completion_tokens"]
    assert expected <= elapsed_ms < expected + 1000
    assert usage["prompt_tokens"] > usage["completion_tokens"] / 10 > 0


async def test_requests_beyond_the_concurrency_limit_get_429_with_retry_after() -> None:
    sim, client = await _client(SimConfig(latency_ms=400, max_concurrency=2))
    try:
        answers = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=_body()) for _ in range(3))
        )
        statuses = sorted(r.status for r in answers)
        refused = next(r for r in answers if r.status == 429)
        retry_after = float(refused.headers["retry-after"])
    finally:
        await client.close()
    assert statuses == [200, 200, 429]
    assert retry_after > 0
    assert sim.stats["refused_concurrency"] == 1
    assert sim.stats["max_concurrency_seen"] == 2


async def test_tokens_per_minute_are_enforced_with_the_time_until_budget_frees() -> None:
    one = _body(10)
    sim, client = await _client(SimConfig(provider="openai", tokens_per_minute=10_000))
    try:
        first = await client.post("/v1/chat/completions", json=one)
        usage = (await first.json())["usage"]
        spent = usage["prompt_tokens"] + usage["completion_tokens"]
        sent = 1
        while True:  # until the minute's budget is gone
            resp = await client.post("/v1/chat/completions", json=one)
            if resp.status == 429:
                break
            sent += 1
            assert sent * spent <= 10_000
        retry_after = float(resp.headers["retry-after"])
        remaining = int(resp.headers["x-ratelimit-remaining-tokens"])
    finally:
        await client.close()
    assert (sent + 1) * spent > 10_000  # refused exactly when the budget ran out
    assert 55 < retry_after <= 60  # the first request's tokens free a minute after it
    assert remaining == 10_000 - sent * spent
    assert sim.stats["refused_tpm"] == 1
