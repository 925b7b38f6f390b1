"""/readyz follows the model endpoint: a processor whose endpoint starts refusing its key
turns not-ready (so compose and Kubernetes see it), and ready again when it answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _ready(url: str) -> int:
    with contextlib.suppress(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as resp:
            return resp.status
    return 0


async def _until(url: str, status: int, wait_s: float = 45) -> None:
    deadline = time.monotonic() + wait_s
    while await _ready(url) != status:
        assert time.monotonic() < deadline, f"/readyz never answered {status}"
        await asyncio.sleep(0.3)


async def test_readiness_follows_a_refusing_endpoint(
    deploy: Callable[..., Awaitable[Deployment]],
) -> None:
    dep = await deploy()
    await _until(dep.web, 200)
    previous = dep.sim.config
    dep.sim.config = previous.model_copy(update={"api_key": "sk-someone-else"})
    try:
        await dep.produce_items([{"_instance": "r-1", "comment": "hello"}])
        await _until(dep.web, 503)
    finally:
        dep.sim.config = previous
    # Answered again: ready, and the item went through (nothing was dropped meanwhile).
    await _until(dep.web, 200)
    report = await dep.settle(1)
    assert report.unaccounted == 0
    assert sum(report.calls_by_tool.values()) + report.no_action >= 1
