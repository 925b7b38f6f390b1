"""A rebalance on the real broker costs the partitions that stay nothing (issue 37): the
eager protocol revokes every partition, but a unit whose partition is assigned back is
resumed, not reopened (no restore, nothing asked again); the partitions that move come
back later reading only their changelog's delta. Stateful tickets, two processors of one
group, every workflow ends and no call is published twice."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from instanced_stream.activities.worker import load_activities
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = Path(__file__).resolve().parents[2] / "examples" / "tickets"
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
MOVE = re.compile(r"partitions \[([\d, ]*)\] resumed, \[([\d, ]*)\] closed, \[([\d, ]*)\] opening")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _ready(url: str, partitions: int, wait_s: float = 60) -> None:
    """Until /readyz says every partition given to it is open, and it holds `partitions`."""
    deadline = time.monotonic() + wait_s
    body: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}/readyz") as resp:
                    body = await resp.json()
                    if resp.status == 200 and len(body["partitions"]) == partitions:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    pytest.fail(f"not ready with {partitions} partitions: {body}")


async def _done(dep: Deployment, names: set[str], wait_s: float = 90) -> set[str]:
    deadline = time.monotonic() + wait_s
    while True:
        done = {d["instance"] for d in await dep.records(dep.settings.topics.done)}
        if names <= done or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.5)


def _moves(log: str) -> list[tuple[list[int], list[int], list[int]]]:
    def ints(text: str) -> list[int]:
        return [int(n) for n in text.split(",") if n.strip()]

    return [(ints(a), ints(b), ints(c)) for a, b, c in MOVE.findall(log)]


async def test_partitions_that_stay_resume_and_those_that_return_read_the_delta(
    deploy: Deploy,
) -> None:
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    port = _port()
    second = ProcessorProcess(
        {**dep.proc.env, "STREAM_WEB_PORT": str(port)},
        dep.proc.log_path.with_name("second.log"),
    )
    dep.extra = [second]
    try:
        await _ready(dep.web, 4)
        first = tickets(24)
        await dep.produce_items(first)
        assert await _done(dep, {t["_instance"] for t in first}) >= {t["_instance"] for t in first}
        asked = dep.sim.stats["completions"]
        second.start()  # the group rebalances: two partitions each
        await _ready(f"http://127.0.0.1:{port}", 2)
        await _ready(dep.web, 2)
        log = dep.proc.log_path.read_text()
        resumed, closed, opening = _moves(log)[-1]
        assert len(resumed) == 2 and len(closed) == 2 and not opening, _moves(log)
        # Nothing was restored or asked again for the partitions that stayed.
        restored = re.findall(r"partition (\d+): \d+ states restored", log)
        assert sorted(map(int, restored)) == [0, 1, 2, 3], restored  # the first opening only
        assert dep.sim.stats["completions"] == asked
        second.stop()  # they come back: the kept stores read only what came after
        await _ready(dep.web, 4)
        log = dep.proc.log_path.read_text()
        back = re.findall(r"partition (\d+): \d+ states restored in [\d.]+s \(the delta", log)
        assert sorted(map(int, back)) == sorted(closed), log[-3000:]
        more = tickets(40)[24:]
        await dep.produce_items(more)
        names = {t["_instance"] for t in first + more}
        done = await _done(dep, names)
    finally:
        stop.set()
        await worker
    assert names <= done, await stuck_report(dep, TOOLS)
    calls: list[dict[str, Any]] = []
    for tool in TOOLS:
        calls += await dep.records(dep.activity_topic(tool))
    assert len(calls) == len({c["call_id"] for c in calls}), "a call was published twice"
