"""The shadow sample on a real broker and the simulator: agreement measured live, the
window shrunk when batched decisions drift (the simulator's disagree_rate), kept at the
maximum when they do not (`stream demo` on the simulator, the issue's Done-when)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.testing.samples import comments
from instanced_stream_bench.testing.sim.account import Faults
from instanced_stream_bench.testing.sim.request import read_request

from tests.conftest import Deployment, demo_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
SPEC = EXAMPLES / "seed_moderation" / "agent.yaml"  # quality: shadow 0.3, min_agreement 0.9


async def _quality(dep: Deployment) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{dep.web}/api/live") as resp:
        live: dict[str, Any] = await resp.json()
    quality: dict[str, Any] = live["quality"]
    return quality


async def _until(dep: Deployment, ok: Callable[[dict[str, Any]], bool], wait_s: float) -> Any:
    deadline = time.monotonic() + wait_s
    quality: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:  # the processor's page is up once it has started
            quality = await _quality(dep)
        except aiohttp.ClientError:
            quality = {}
        if quality and ok(quality):
            break
        await asyncio.sleep(0.3)
    return quality


async def test_drifting_decisions_shrink_the_window(deploy: Deploy) -> None:
    dep = await deploy(SPEC, STREAM_DELIVERY="exactly_once")
    # Half the items are decided the other way whenever they share a request.
    faults = Faults(disagree_rate=0.5)
    dep.sim.config = dep.sim.config.model_copy(update={"faults": faults})
    first = comments(100, seed=3)
    await dep.produce_items(first)
    assert (await dep.settle(100)).unaccounted == 0  # no window of the first wave left
    quality = await _until(dep, lambda q: q["window_now"] < 10, 90)
    assert quality["window_now"] < 10, quality
    change = quality["changes"][0]
    assert change["old"] == 10 and change["new"] == 5 and change["compared"] >= 10
    assert change["upper"] < 0.9  # shown below the target, not merely unproven
    assert quality["shadowed"] >= 10 and quality["agreement"] < 0.8
    # The next items are asked in windows no larger than the controller's.
    window, seen = quality["window_now"], dep.sim.seen_total
    # New content, not the first wave's twins (dedupe would answer those from its cache).
    second = [
        {**c, "_instance": f"second-{c['_instance']}", "comment": f"{c['comment']} Again."}
        for c in first[:50]
    ]
    await dep.produce_items(second)
    report = await dep.settle(150)
    assert report.unaccounted == 0
    later = list(dep.sim.seen)[-(dep.sim.seen_total - seen) :]
    sizes = [len(read_request(m).items) for m in later]
    assert sizes and max(sizes) <= window, sizes
    # Shadow answers publish nothing: one moderation call per item, 150 in all.
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert len({c["call_id"] for c in calls}) == len(calls) == 150
    audit = await dep.cli("audit", "--processor", dep.web)
    assert "quality:" in audit.stdout and "window now" in audit.stdout, audit.stdout
    assert "window shrinks 10 -> 5" in dep.proc.tail(400)


def test_demo_on_the_simulator_keeps_the_largest_window(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DELIVERY", "exactly_once")  # the units, whatever the env says
    summary = demo_json(bootstrap, "--example", "seed_moderation", "--items", "120", timeout=200)
    quality = summary["quality"]
    assert quality["shadowed"] > 0 and quality["agreement"] == 1.0, quality
    assert quality["window_now"] == summary["window_max_items"] == 10
    assert summary["unaccounted"] == 0
