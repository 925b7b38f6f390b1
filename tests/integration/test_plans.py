"""The seeds' Plan on the real broker and the exactly-once runtime (#26): the model writes
the plan; a lazy plan is proposed once, runs nothing latent before approval, then runs in
dependency order; a spec without a plan keeps no state at all."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from instanced_stream.activities.worker import load_activities
from instanced_stream.kafka.topics import read_topic, state_changelog
from instanced_stream.settings import EXAMPLES
from instanced_stream.testing.samples import tickets
from instanced_stream.tools.seeds import seed_items

from tests.conftest import Deployment, workflow_states
from tests.flows import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = EXAMPLES / "tickets"
EXACTLY_ONCE = {"STREAM_DELIVERY": "exactly_once"}


async def test_a_spec_without_a_plan_leaves_the_state_changelog_empty(deploy: Deploy) -> None:
    """The manager seed has a latent tool writing to †state but no plan: one-shot and
    stateless, so nothing is created, read or kept in a state store."""
    dep = await deploy(spec_path=EXAMPLES / "seeds" / "manager.yaml", **EXACTLY_ONCE)
    items = seed_items("manager")
    await dep.produce_items(items)
    report = await dep.settle(len(items))
    assert report.unaccounted == 0
    records = [r async for r in read_topic(dep.bootstrap, state_changelog(dep.settings))]
    assert records == []


async def test_a_lazy_graph_is_proposed_once_then_runs_in_dependency_order(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load((TICKETS / "agent.yaml").read_text())
    data["plan"] = {"mode": "lazy", "goal": "route every ticket", "maxTurns": 4}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    dep = await deploy(spec_path=path, **EXACTLY_ONCE)
    await dep.produce_items(tickets(2))

    async def both_proposed() -> list[dict[str, Any]]:
        got = await dep.records(dep.settings.topics.proposals)
        return got if len(got) >= 2 else []

    proposals = await until(both_proposed, 60)
    assert len(proposals) == 2
    for p in proposals:
        latent = [c for c in p["calls"] if c["_tool"] == "summarize"]
        assert latent and all("summary" not in c for c in latent)  # planned, not answered
        assert p["goal"] == "route every ticket"
        assert [s["status"] for s in p["plan"]] == ["proposed"] * len(p["plan"])
    assert not await dep.records(dep.activity_topic("lookupCustomer"))  # nothing ran yet
    states = await workflow_states(dep)
    assert all("summary" not in s["state"] for s in states.values())
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        for p in proposals:
            done = await dep.cli(
                "approve", "--instance", p["instance"], STREAM_SPEC=str(path), **EXACTLY_ONCE
            )
            assert done.returncode == 0, done.stderr

        async def all_done() -> list[dict[str, Any]]:
            got = await dep.records(dep.settings.topics.done)
            return got if len(got) >= 2 else []

        finished = await until(all_done, 90)
    finally:
        stop.set()
        await worker
    assert len(await dep.records(dep.settings.topics.proposals)) == 2  # asked once per graph
    assert {d["status"] for d in finished} == {"done"}
    for d in finished:
        assert d["state"]["summary"]["summary"]  # the latent step, answered after approval
        assert "customer" in d["state"]
    routed = await dep.records(dep.activity_topic("routeTicket"))
    assert {r["instance"] for r in routed} == {p["instance"] for p in proposals}
    for r in routed:  # it ran after what it reads: its context holds the looked-up state
        assert any("customer" in str(c) for c in r["context"])
