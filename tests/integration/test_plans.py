"""The seeds' Plan on the real broker and the exactly-once runtime (#26): the model writes
the plan; a lazy plan is proposed once, runs nothing latent before approval, then runs in
dependency order; a spec without a plan keeps no state at all. Whatever order the model
lists a plan's calls in, they run in the graph's order (#45), and thoughts reach no topic."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient
from instanced_stream.activities.worker import load_activities
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import answer_journal, read_topic, state_changelog
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.harness.seeds import approve_until_ended, seed_items
from instanced_stream_bench.testing.samples import tickets
from instanced_stream_bench.testing.sim.planner import THOUGHT

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


# Issue 45: the graph decides, whatever order the model writes.


async def _every_topic(dep: Deployment) -> dict[str, bytes]:
    """Every record on every topic of this deployment (its prefix), keys and values."""
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap, **options_for(dep.bootstrap))
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(dep.settings.topic_prefix)]
    finally:
        await admin.close()
    out: dict[str, bytes] = {}
    for name in names:
        async for rec in read_topic(dep.bootstrap, name):
            out[name] = out.get(name, b"") + (rec.key or b"") + (rec.value or b"") + b"\n"
    return out


async def _stamps(dep: Deployment, topic: str) -> dict[tuple[str, str], int]:
    """(instance, tool) -> the record's timestamp (ms), for results and activity records."""
    out = {}
    async for rec in read_topic(dep.bootstrap, topic):
        value = orjson.loads(rec.value or b"{}")
        out[(value["instance"], value["tool"])] = rec.timestamp
    return out


def _listed(trace_ids: list[str], tool: str) -> int:
    return next(k for k, cid in enumerate(trace_ids) if f"/{tool}/" in cid)


async def _run_tickets(dep: Deployment, n: int, approve: bool = False) -> dict[str, Any]:
    """n tickets through the deployment with the example's activity worker (approving
    every proposal when `approve`); returns the done records by instance."""
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        return await _run(dep, tickets(n), approve)
    finally:
        stop.set()
        await worker


async def _run(dep: Deployment, items: list[dict[str, Any]], approve: bool) -> dict[str, Any]:
    """The items in, every proposal approved as it comes (when `approve`, as the seeds'
    demo approves them), until every workflow has its done record; returns them by
    instance."""
    await dep.produce_items(items)
    deadline = time.monotonic() + 150
    if approve:
        await approve_until_ended(dep.bootstrap, dep.settings, len(items), 150)

    async def all_done() -> dict[str, Any]:
        got = {d["instance"]: d for d in await dep.records(dep.settings.topics.done)}
        return got if len(got) >= len(items) else {}

    return dict(await until(all_done, max(0.0, deadline - time.monotonic())))


@pytest.mark.parametrize("order", ["readers_first", "interleaved"])
async def test_an_eager_plan_written_readers_first_runs_in_graph_order(
    deploy: Deploy, order: str
) -> None:
    """The tickets example with the simulator writing each plan's readers before their
    producers (or interleaved, with the latent summary reading the awaited customer):
    the on-call page goes out after assessUrgency's result and only on the urgent branch,
    the summary is written from the looked-up customer, and the counters say so."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml", **EXACTLY_ONCE)
    dep.sim.config = dep.sim.config.model_copy(update={"plan_order": order})
    done = await _run_tickets(dep, 8)
    assert len(done) == 8 and {d["status"] for d in done.values()} == {"done"}
    for d in done.values():
        first = d["trace"][0]["call_ids"]  # turn 1's calls, in the answer's order
        if order == "readers_first":  # the precondition: the reader came first
            assert _listed(first, "pageOnCall") < _listed(first, "assessUrgency")
        assert d["state"]["summary"]["summary"] and d["state"]["customer"]
    paged = await _stamps(dep, dep.activity_topic("pageOnCall"))
    results = await _stamps(dep, dep.settings.topics.results)
    urgent = {i for i, d in done.items() if "urgent" in d["state"]}
    assert urgent and urgent != set(done)  # both branches taken: the test can tell
    assert {i for i, _ in paged} == urgent
    for (instance, _), stamp in paged.items():
        assert stamp >= results[(instance, "assessUrgency")]
    states = await workflow_states(dep)
    counts: Counter[str] = Counter()
    for st in states.values():
        counts.update(st.get("counts", {}))
    assert counts["skipped_branch"] == len(done) - len(urgent)
    assert counts["ran_on_missing_input"] == 0 and counts["skipped_input"] == 0
    # Thoughts (two per instance before routing) are on no topic of the outputs, and two
    # of them for one instance are no duplicate_call. The answer journal held each answer
    # whole, thoughts too, until its commit (a redo takes it instead of asking again): the
    # processor's own topic, each entry's last record there its tombstone.
    everything = await _every_topic(dep)
    journal = answer_journal(dep.settings)
    assert dep.settings.topics.done in everything  # the reader saw the topics
    assert not [t for t, data in everything.items() if THOUGHT.encode() in data and t != journal]
    last: dict[bytes, bytes | None] = {}
    async for rec in read_topic(dep.bootstrap, journal):
        assert rec.key is not None
        last[rec.key] = rec.value
    assert last and all(v is None for v in last.values()), "an answer left in the journal"
    assert not await dep.records(dep.settings.topics.dead_letter)


async def test_a_lazy_plan_written_readers_first_runs_in_graph_order(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load((TICKETS / "agent.yaml").read_text())
    data["plan"] = {"mode": "lazy", "maxTurns": 4}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    dep = await deploy(spec_path=path, **EXACTLY_ONCE)
    dep.sim.config = dep.sim.config.model_copy(update={"plan_order": "readers_first"})
    done = await _run_tickets(dep, 6, approve=True)
    assert {d["status"] for d in done.values()} == {"done"}
    proposals = await dep.records(dep.settings.topics.proposals)
    for p in proposals:  # the precondition: every graph lists its readers first
        tools = [c["_tool"] for c in p["calls"]]
        assert tools.index("pageOnCall") < tools.index("assessUrgency")
        assert tools.index("routeTicket") < tools.index("lookupCustomer")
    paged = await _stamps(dep, dep.activity_topic("pageOnCall"))
    routed = await _stamps(dep, dep.activity_topic("routeTicket"))
    results = await _stamps(dep, dep.settings.topics.results)
    urgent = {i for i, d in done.items() if "urgent" in d["state"]}
    assert urgent and urgent != set(done)
    assert {i for i, _ in paged} == urgent
    for (instance, _), stamp in paged.items():
        assert stamp >= results[(instance, "assessUrgency")]
    for (instance, _), stamp in routed.items():
        assert stamp >= max(results[(instance, t)] for t in ("assessUrgency", "lookupCustomer"))
    states = await workflow_states(dep)
    counts: Counter[str] = Counter()
    for st in states.values():
        counts.update(st.get("counts", {}))
    assert counts["skipped_branch"] == len(done) - len(urgent)
    assert counts["ran_on_missing_input"] == 0


@pytest.mark.parametrize("order", ["producers_first", "readers_first"])
async def test_the_seeds_lazy_example_runs_in_graph_order_either_way(
    deploy: Deploy, order: str
) -> None:
    """The Plan seed's lazy example (assess, then moderateComment reading the assessment),
    its graphs written in either order: each moderation call goes out after its
    assessment was answered and reads it."""
    dep = await deploy(spec_path=EXAMPLES / "seeds" / "lazy.yaml", **EXACTLY_ONCE)
    dep.sim.config = dep.sim.config.model_copy(update={"plan_order": order})
    items = seed_items("lazy")
    done = await _run(dep, items, approve=True)
    assert {d["status"] for d in done.values()} == {"done"}
    proposals = await dep.records(dep.settings.topics.proposals)
    assert len(proposals) == len(items)
    for p in proposals:  # the precondition: the order the simulator was told
        tools = [c["_tool"] for c in p["calls"]]
        assert (tools.index("moderateComment") < tools.index("assess")) == (
            order == "readers_first"
        )
    moderated = await dep.records(dep.activity_topic("moderateComment"))
    assert {r["instance"] for r in moderated} == set(done)
    for rec in moderated:
        (read,) = [c for c in rec["context"] if c.get("scope") == "†state.assessment"]
        assert read["assessment"] == done[rec["instance"]]["state"]["assessment"]
        assert rec["turn"] >= 2  # after the follow-up turn that answered the assessment
    states = await workflow_states(dep)
    assert sum(st.get("counts", {}).get("ran_on_missing_input", 0) for st in states.values()) == 0
