"""Pacing by the provider's rate-limit headers against the simulator's OpenAI profile: an
account of 40 requests a minute asked more, four at a time. Without pacing every request
sent past the budget meets a 429; with it, once the budget is spent, the requests wait in
the pacer until the account's window is whole again (what `x-ratelimit-reset-requests`
says), and only those already at the endpoint when it ran out are refused.

Gated on events, not on the clock: each run stops as soon as the budget is spent and every
request has met its 429 or is held by the pacer; the minute itself is never waited out
(the pacer's hold is read and compared with the account's window instead). Both runs take
seconds; the old form ran two full minutes and measured 429s per 1,000 requests: 233 off,
50 on (2 cores)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.client import LLM
from instanced_stream.llm.options import Collaborators
from instanced_stream.llm.pacer import Pacer
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.account import SimConfig
from instanced_stream_bench.testing.sim.server import Simulator, running_simulator

from tests.fakes import make_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RPM, AT_ONCE = 40, 4
REQUESTS = RPM + 3 * AT_ONCE  # more than the budget: some must wait or be refused


class _Watched(Pacer):
    """The pacer, counting the requests it holds back at this moment."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = 0

    async def wait(self, tokens: int) -> None:
        self.holding += 1
        try:
            await super().wait(tokens)
        finally:
            self.holding -= 1


async def _run_until(
    sim: Simulator, url: str, pacer: _Watched | None, done: Callable[[], bool]
) -> int:
    """REQUESTS requests, AT_ONCE at a time, until `done()` (or the test's deadline);
    returns how many the pacer held back then."""
    llm = LLM(
        base_url=url,
        api_key="none",
        model="gpt-4o-mini",
        timeout_s=30,
        collaborators=Collaborators(pacer=pacer),
    )
    gate = asyncio.Semaphore(AT_ONCE)
    prompt = PromptBuilder(load_spec(DEFAULT_SPEC))

    async def one(k: int) -> None:
        async with gate:
            batch = make_batch([f"a kind remark {k}"])
            await llm.complete(prompt.messages(batch), prompt.response_format(1))

    flow = asyncio.gather(*(one(k) for k in range(REQUESTS)))
    try:
        deadline = time.monotonic() + 60  # far below the minute: the window never rolls
        while not done():
            assert time.monotonic() < deadline, f"never settled: {dict(sim.stats)}"
            assert not flow.done(), f"every request finished inside the budget: {sim.stats}"
            await asyncio.sleep(0.05)
        holding = pacer.holding if pacer is not None else 0
    finally:
        flow.cancel()
        await asyncio.gather(flow, return_exceptions=True)
        await llm.close()
    print(f"pacing {'on' if pacer else 'off'}: {dict(sim.stats)}, held {holding}")
    return holding


def test_unpaced_requests_past_the_budget_meet_429s() -> None:
    config = SimConfig(provider="openai", requests_per_minute=RPM)
    with running_simulator(config) as (sim, url):
        stats = sim.stats
        # The budget spent, and every request in flight then refused (each now sleeps
        # out its retry-after, which ends when the window's oldest request leaves it).
        asyncio.run(
            _run_until(
                sim,
                url,
                None,
                lambda: stats["completions"] >= RPM and stats["refused_rpm"] >= AT_ONCE,
            )
        )
        assert stats["completions"] == RPM  # nothing answered past the budget
        # Every request sent past the budget was refused: nothing held any back.
        assert stats["refused_rpm"] == stats["requests"] - RPM >= AT_ONCE


def test_paced_requests_wait_for_the_budgets_reset() -> None:
    config = SimConfig(provider="openai", requests_per_minute=RPM)
    pacer = _Watched()
    with running_simulator(config) as (sim, url):
        stats = sim.stats
        # The budget spent, and every request slot either held by the pacer or (at the
        # endpoint when the budget ran out) refused.
        holding = asyncio.run(
            _run_until(
                sim,
                url,
                pacer,
                lambda: (
                    stats["completions"] >= RPM and pacer.holding + stats["refused_rpm"] >= AT_ONCE
                ),
            )
        )
        held_at = time.monotonic()
        newest = sim.quota.sent[-1]  # the account's last admitted request
    assert stats["completions"] == RPM
    # Only those already at the endpoint when the last answer said "0 left" met a 429.
    assert stats["refused_rpm"] <= AT_ONCE - 1
    assert holding == AT_ONCE - stats["refused_rpm"] >= 1  # the others held, not sent
    # The pacer's decision: nothing goes before the window is whole again, when the newest
    # request leaves it (a hold until the oldest left would burst into 429s again).
    assert pacer.hold_until >= newest + 60 - 0.05
    assert pacer.hold_until - held_at > 30
