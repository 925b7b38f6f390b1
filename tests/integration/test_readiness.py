"""/readyz says whether the processor serves its partitions, not whether the model answers:
an LLM outage is the same for every pod, and a readiness that followed it made every pod
unready at once (disruption budgets then blocked node drains, rollouts stalled). While the
endpoint refuses the key the pod stays ready, /readyz's body and the circuit metric say the
model is down, and the item waits rather than being dropped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _ready(url: str) -> tuple[int, dict[str, Any]]:
    with contextlib.suppress(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as resp:
            return resp.status, await resp.json()
    return 0, {}


async def _until(url: str, model_ok: bool, wait_s: float = 45) -> list[int]:
    """Polls /readyz until its body says `model_ok`; every status seen on the way."""
    deadline = time.monotonic() + wait_s
    seen = []
    while True:
        status, body = await _ready(url)
        seen.append(status)
        if status and body.get("model_ok") is model_ok:
            return seen
        assert time.monotonic() < deadline, f"/readyz never said model_ok={model_ok}: {body}"
        await asyncio.sleep(0.3)


async def test_readiness_does_not_follow_the_model(
    deploy: Callable[..., Awaitable[Deployment]],
) -> None:
    dep = await deploy(STREAM_DELIVERY="exactly_once")
    deadline = time.monotonic() + 45
    while (await _ready(dep.web))[0] != 200:
        assert time.monotonic() < deadline, "never ready"
        await asyncio.sleep(0.3)
    previous = dep.sim.config
    dep.sim.config = previous.model_copy(update={"api_key": "sk-someone-else"})
    try:
        await dep.produce_items([{"_instance": "r-1", "comment": "hello"}])
        await _until(dep.web, model_ok=False)
        # The model refuses us, and the pod is ready all the same, for a while.
        statuses = [(await _ready(dep.web))[0] for _ in range(5)]
        assert statuses == [200] * 5
    finally:
        dep.sim.config = previous
    # Answered again: the item went through (nothing was dropped meanwhile).
    assert set(await _until(dep.web, model_ok=True)) == {200}
    report = await dep.settle(1)
    assert report.unaccounted == 0
    assert sum(report.calls_by_tool.values()) + report.no_action >= 1
