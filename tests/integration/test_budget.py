"""A spend ceiling (issue 39): with `budget.usd_per_hour` low enough to bite, the processor
paces itself: the spend rate holds within 10% of the ceiling over the run, input is held
(never dropped, nothing dead-lettered), every item has exactly one outcome, and the pod
stays ready while paced."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from instanced_stream.settings import DEFAULT_SPEC

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
CEILING = 0.54  # USD per hour: 1.5e-4 a second, low enough to hold this backlog back
N = 150


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(found[1]) if found else 0.0


async def test_a_ceiling_that_bites_holds_the_spend_rate_and_loses_nothing(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load(DEFAULT_SPEC.read_text())
    data["budget"] = {"usd_per_hour": CEILING, "burst_s": 2}
    data.setdefault("window", {}).update(max_items=5, max_wait_ms=50)
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(data))
    dep = await deploy(spec_path=spec)
    items = [{"_instance": f"b-{i:03d}", "comment": f"Comment {i} on the post."} for i in range(N)]
    samples: list[tuple[float, float]] = []  # (when, USD spent so far)
    ready: list[tuple[int, float]] = []  # (/readyz status, rebalances so far)
    paced_seen = False
    started = time.monotonic()
    await dep.produce_items(items)
    task = asyncio.create_task(dep.settle(N, wait_s=240))
    async with aiohttp.ClientSession() as http:
        while not task.done():
            try:  # the page comes up a moment after the process
                async with http.get(f"{dep.web}/metrics") as resp:
                    text = await resp.text()
                async with http.get(f"{dep.web}/readyz") as resp:
                    status = resp.status
                async with http.get(f"{dep.web}/api/live") as resp:
                    live: dict[str, Any] = await resp.json()
            except aiohttp.ClientConnectorError:
                await asyncio.wait([task], timeout=0.5)
                continue
            samples.append((time.monotonic(), _metric(text, "instanced_stream_llm_cost_usd_total")))
            ready.append((status, _metric(text, "instanced_stream_rebalances_total")))
            paced_seen = paced_seen or bool(live["budget"].get("paced"))
            await asyncio.wait([task], timeout=0.5)
        async with http.get(f"{dep.web}/metrics") as resp:
            text = await resp.text()
    report = task.result()
    took = time.monotonic() - started
    # The precondition: the ceiling bit (unpaced, this backlog drains in a few seconds).
    assert took > 20, took
    assert _metric(text, "instanced_stream_paced_by_budget_seconds_total") > 5
    assert paced_seen
    # Exactly once, nothing dropped or dead-lettered for budget.
    assert report.unaccounted == 0 and report.inputs == N
    assert report.duplicate_calls == 0 and report.duplicate_outcomes == 0
    assert report.item_dead_letters == 0 and not report.dead_letters
    # The spend rate over the run, after the first spend (the burst the ceiling allows).
    spent = [(t, usd) for t, usd in samples if usd > 0]
    # Up to the sample that first showed the final spend: after it the backlog is gone and
    # the settle's quiet period only adds time without spend (it had diluted the rate by
    # 12% when the machine was slow to see the quiet).
    final = spent[-1][1]
    (t0, usd0), (t1, usd1) = spent[0], next((t, u) for t, u in spent if u == final)
    rate = 3600 * (usd1 - usd0) / (t1 - t0)
    assert abs(rate - CEILING) <= 0.1 * CEILING, (rate, CEILING, took)
    assert _metric(text, "instanced_stream_budget_usd_per_hour") == pytest.approx(CEILING)
    # Ready whenever it served its partitions (a rebalance, which a loaded machine's late
    # heartbeat can cause, is the one time it is not), paced or not.
    first = [status for status, _ in ready].index(200)
    unready = [
        k
        for k in range(first, len(ready))
        if ready[k][0] != 200 and ready[k - 1][1] == ready[min(k + 1, len(ready) - 1)][1]
    ]
    assert len(ready) - first > 10 and not unready, ready
