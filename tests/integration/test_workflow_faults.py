"""Stateful workflows under kill -9, on the real broker: the processor dies at each crash
point of a two-turn workflow (inside a commit's open transaction, just after a commit,
after a result's change is staged and before its commit, after an approval's), is
restarted, and every workflow still ends, once, without a loop or a duplicate.

The kill moment is drawn per session (printed, replay with STREAM_CHAOS_SEED)."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from instanced_stream.activities.worker import load_activities
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report, workflow_states

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = Path(__file__).resolve().parents[2] / "examples" / "tickets"
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
ITEMS = 6


def _nth() -> int:
    seed = int(os.environ.get("STREAM_CHAOS_SEED") or secrets.randbits(32))
    nth = random.Random(seed).randint(1, 2)
    print(f"chaos seed {seed} (replay: STREAM_CHAOS_SEED={seed}): kill at pass {nth}")
    return nth


async def _killed(dep: Deployment, wait_s: float = 90) -> None:
    assert dep.proc.proc is not None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if dep.proc.proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    code = dep.proc.proc.poll()
    assert code == -signal.SIGKILL, f"the crash point never fired\n{dep.proc.tail()}"


async def _calls(dep: Deployment) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in TOOLS:
        out += await dep.records(dep.activity_topic(tool))
    return out


async def _done(dep: Deployment, n: int, wait_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    while True:
        done = await dep.records(dep.settings.topics.done)
        if len({d["instance"] for d in done}) >= n or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.5)


async def _all_ended(dep: Deployment, names: set[str], wait_s: float = 60) -> dict[str, Any]:
    """The stored states of `names` once all are done and the processor has no batch in
    flight; else the test fails with what was stuck."""
    deadline = time.monotonic() + wait_s
    states: dict[str, Any] = {}
    flying = -1
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            every = await workflow_states(dep)
            states = {k: v for k, v in every.items() if k in names}
            try:
                async with session.get(f"{dep.web}/api/live") as resp:
                    flying = (await resp.json())["in_flight"]
            except aiohttp.ClientConnectionError:  # restarted after its kill: not serving yet
                flying = -1
            ended = all(s["status"] == "done" for s in states.values())
            if set(states) == names and ended and flying == 0:
                return states
            await asyncio.sleep(0.5)
    pytest.fail(f"not ended (in flight {flying}): {states}\n{await stuck_report(dep, TOOLS)}")


def _one_call_one_item(calls: list[dict[str, Any]]) -> None:
    """Duplicates only ever repeat a call: the same call_id, instance, turn and call."""
    seen: dict[str, tuple[str, int, str]] = {}
    for rec in calls:
        what = (rec["instance"], rec["turn"], repr(sorted(rec["call"].items())))
        assert seen.setdefault(rec["call_id"], what) == what, rec["call_id"]


# Inside a transaction (its state, outputs and offsets sent, not committed), right after a
# commit, between a result's change and its commit; an approval's below.
POINTS = ("mid_commit", "after_commit", "after_result")


async def test_kill_9_mid_workflow_every_workflow_ends_once(deploy: Deploy) -> None:
    """One processor killed at each point in turn, each time with a fresh wave of
    workflows in flight (and the last wave's redo, if any, still under way), restarted
    each time: one deployment and one settling for three kills."""
    nth = _nth()
    dep = await deploy(spec_path=TICKETS / "agent.yaml", STREAM_CRASH_AT=f"{POINTS[0]}:{nth}")
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    asked = dep.sim.stats["completions"]
    items: list[dict[str, Any]] = []
    try:
        for k, point in enumerate(POINTS):
            if k:
                dep.proc.env["STREAM_CRASH_AT"] = f"{point}:{nth}"
                dep.proc.start()
            wave = [{**t, "_instance": f"{point}-{t['_instance']}"} for t in tickets(ITEMS)]
            items += wave
            await dep.produce_items(wave)
            await _killed(dep)
            assert f"SIGKILL at {point} (hit {nth})" in dep.proc.tail(400)
        fired = dep.proc.log_path.read_text(errors="replace").count("fault injection: SIGKILL at")
        print(f"{fired} kills, each at its point with workflows in flight")
        assert fired == len(POINTS)
        dep.proc.env.pop("STREAM_CRASH_AT")
        dep.proc.start()
        done = await _done(dep, len(items))
        # Nothing can loop: every stored workflow is done, owes nothing and awaits
        # nothing (a turn is offered only to a `ready` workflow), and no batch is in
        # flight; read from the changelog and the processor, not waited out.
        stored = await _all_ended(dep, {i["_instance"] for i in items})
        assert all(s["status"] == "done" and not s["pending"] for s in stored.values())
        settled = dep.sim.stats["completions"]
        done = await dep.records(dep.settings.topics.done)  # all of them, now nothing flies
    finally:
        stop.set()
        await worker
    ended = {d["instance"] for d in done}
    assert ended == {i["_instance"] for i in items}, await stuck_report(dep, TOOLS)
    for rec in done:
        assert rec["status"] == "done", rec
        assert [t["turn"] for t in rec["trace"]] == [1, 2], rec["trace"]  # none lost or redone
        assert "customer" in rec["state"]
    assert len(done) == len(items)  # each workflow ended once
    # Two turns of six items a wave, asked again at most once per kill: bounded, not a loop.
    assert dep.sim.stats["completions"] - asked <= 12 * len(POINTS)
    calls = await _calls(dep)
    _one_call_one_item(calls)
    assert len(calls) == len({c["call_id"] for c in calls}), "a call was published twice"
    routed = {r["instance"] for r in calls if r["tool"] == "routeTicket"}
    assert routed == {i["_instance"] for i in items}
    assert dep.sim.stats["completions"] == settled, "a finished workflow was asked again"


async def test_kill_9_between_approval_and_publish_runs_the_approved_calls(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load((TICKETS / "agent.yaml").read_text())
    data["plan"] = {"mode": "lazy", "steps": ["look up", "route"], "maxTurns": 4}
    lazy = tmp_path / "agent.yaml"
    lazy.write_text(yaml.safe_dump(data))
    dep = await deploy(spec_path=lazy, STREAM_CRASH_AT="after_approval:1")
    await dep.produce_items(tickets(3))
    report = await dep.settle(3)
    assert report.unaccounted == 0 and report.proposals == 3
    proposals = {p["instance"]: p for p in await dep.records(dep.settings.topics.proposals)}
    approved = await dep.cli("approve", "--instance", "t-000001", STREAM_SPEC=str(lazy))
    assert approved.returncode == 0, approved.stderr
    await _killed(dep)  # the approval is staged with its calls, not yet committed
    assert not await dep.records(dep.activity_topic("lookupCustomer"))
    dep.proc.env.pop("STREAM_CRASH_AT")
    dep.proc.start()
    for _ in range(120):
        ran = await dep.records(dep.activity_topic("lookupCustomer"))
        if ran:
            break
        await asyncio.sleep(0.5)
    assert [r["instance"] for r in ran] == ["t-000001"]
    assert ran[0]["call_id"] in proposals["t-000001"]["call_ids"]
