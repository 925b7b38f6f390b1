"""Pacing by the provider's rate-limit headers against the simulator's OpenAI profile:
an account of 40 requests a minute asked 60 requests, four at a time. Without pacing the
requests past the budget meet 429s; with it they wait for the budget's reset. Measured
(2 cores): 429s per 1,000 requests 233 off, 50 on."""

from __future__ import annotations

import asyncio

import pytest
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.client import LLM
from instanced_stream.llm.pacer import Pacer
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream.testing.sim.account import SimConfig
from instanced_stream.testing.sim.server import running_simulator

from tests.fakes import make_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RPM, REQUESTS, AT_ONCE = 40, 60, 4


async def _run(url: str, pacer: Pacer | None) -> None:
    llm = LLM(base_url=url, api_key="none", model="gpt-4o-mini", timeout_s=30, pacer=pacer)
    gate = asyncio.Semaphore(AT_ONCE)
    prompt = PromptBuilder(load_spec(DEFAULT_SPEC))

    async def one(k: int) -> None:
        async with gate:
            batch = make_batch([f"a kind remark {k}"])
            await llm.complete(prompt.messages(batch), prompt.response_format(1))

    try:
        await asyncio.gather(*(one(k) for k in range(REQUESTS)))
    finally:
        await llm.close()


def _refusals(pacer: Pacer | None) -> int:
    config = SimConfig(provider="openai", requests_per_minute=RPM)
    with running_simulator(config) as (sim, url):
        asyncio.run(_run(url, pacer))
        print(f"pacing {'on' if pacer else 'off'}: {dict(sim.stats)}")
        return int(sim.stats["refused_rpm"])


def test_pacing_turns_429s_into_waits() -> None:
    off = _refusals(None)
    on = _refusals(Pacer())
    per = 1000 / REQUESTS
    print(f"429s per 1,000 requests: pacing off {off * per:.0f}, on {on * per:.0f}")
    # Unpaced, every request in flight meets a 429 each time the minute's budget runs
    # out, and again after each retry-after that ends before it frees.
    assert off >= 2 * AT_ONCE
    assert on <= AT_ONCE  # only those already in flight when the budget ran out
