"""Stateful workflows on the real broker: turns, awaited calls, branches, lazy plans,
latent calls, scopes, the seeds' manager example, and a restart mid-workflow."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from instanced_stream.activities.worker import Activities, load_activities
from instanced_stream.kafka.topics import read_json, read_topic, state_changelog
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, demo_json, live_of, stuck_report, workflow_states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TICKETS = EXAMPLES / "tickets"


def _spec(tmp_path: Path, base: Path, **changes: Any) -> Path:
    data = yaml.safe_load(base.read_text())
    data.update(changes)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]


async def _worker(dep: Deployment) -> tuple[Activities, asyncio.Event, asyncio.Task[None]]:
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    task = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    return registry, stop, task


async def _done(dep: Deployment, n: int, wait_s: float = 90) -> dict[str, dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        done = {d["instance"]: d for d in await dep.records(dep.settings.topics.done)}
        if len(done) >= n or asyncio.get_running_loop().time() > deadline:
            return done
        await asyncio.sleep(0.5)


async def test_two_turns_branch_latent_and_scopes(deploy: Deploy) -> None:
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    registry, stop, task = await _worker(dep)
    items = tickets(8)
    for i, item in enumerate(items):
        item["body"] += f" MARK-{i:02d}"  # planted: must never reach another instance
    try:
        await dep.produce_items(items)
        done = await _done(dep, 8)
    finally:
        stop.set()
        await task
    assert set(done) == {i["_instance"] for i in items}
    for rec in done.values():
        assert rec["status"] == "done" and rec["turns"] == 2
        assert [t["turn"] for t in rec["trace"]] == [1, 2]
        state = rec["state"]
        assert state["customer"]["plan"] in ("enterprise", "free")
        assert ("urgent" in state) != ("routine" in state)  # the activity chose one branch
        assert state["summary"]["summary"]  # latent call with an output path: in state
    routed = {
        r["instance"]: r for r in await read_json(dep.bootstrap, dep.activity_topic("routeTicket"))
    }
    for inst, rec in routed.items():
        state = done[inst]["state"]
        expect = "priority" if "urgent" in state or state["customer"]["vip"] else "standard"
        assert rec["call"]["queue"] == expect  # turn 2 decided from turn 1's results
        assert rec["turn"] == 2
    # #38: the on-call page of turn 1 reads †state.urgent: it waited for assessUrgency and
    # ran only where that branch was written, with the branch's value in its context.
    paged = {
        r["instance"]: r for r in await read_json(dep.bootstrap, dep.activity_topic("pageOnCall"))
    }
    urgent = {i for i, d in done.items() if "urgent" in d["state"]}
    assert urgent and urgent != set(done)  # both branches were taken (the precondition)
    assert set(paged) == urgent
    for inst, rec in paged.items():
        assert rec["turn"] == 1 and rec["call"]["_scopes"] == ["†state.urgent"]
        (imported,) = rec["context"]
        assert imported["scope"] == "†state.urgent"
        assert imported["urgent"] == done[inst]["state"]["urgent"]
    # scopes: an activity sees only its own instance's input and state
    for tool in ("lookupCustomer", "assessUrgency", "routeTicket"):
        for rec in await read_json(dep.bootstrap, dep.activity_topic(tool)):
            own = f"MARK-{int(rec['instance'][2:]) - 1:02d}"
            seen = orjson.dumps(rec["context"]).decode() + orjson.dumps(rec["call"]).decode()
            assert own in orjson.dumps(rec["context"]).decode()
            assert set(re.findall(r"MARK-\d\d", seen)) == {own}
    # a latent thought appears in no topic and no state
    everything = b""
    for topic in [
        dep.settings.topics.done,
        state_changelog(dep.settings),
        *(
            dep.activity_topic(t)
            for t in ("lookupCustomer", "assessUrgency", "routeTicket", "think")
        ),
    ]:
        async for rec in read_topic(dep.bootstrap, topic):
            everything += rec.value or b""
    assert b'"think"' not in everything and b'"thought"' not in everything
    assert registry.answered == 16


async def test_lazy_plan_waits_for_approval_then_runs_or_ends(
    deploy: Deploy, tmp_path: Path
) -> None:
    lazy = _spec(
        tmp_path,
        TICKETS / "agent.yaml",
        plan={"mode": "lazy", "steps": ["look up", "route"], "maxTurns": 4},
    )
    dep = await deploy(spec_path=lazy)
    await dep.produce_items(tickets(3))
    report = await dep.settle(3)
    assert report.unaccounted == 0 and report.proposals == 3
    proposals = {p["instance"]: p for p in await dep.records(dep.settings.topics.proposals)}
    assert {c["_tool"] for c in proposals["t-000001"]["calls"]} >= {"lookupCustomer"}
    assert not await dep.records(dep.activity_topic("lookupCustomer"))  # nothing ran yet

    async def approve(*args: str) -> str:
        done = await dep.cli("approve", *args, STREAM_SPEC=str(lazy))
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "rejected: t-000003" in await approve(
        "--instance", "t-000003", "--reject", "duplicate of an open ticket"
    )
    batch = proposals["t-000001"]["batch"]["id"]
    same_batch = sorted(i for i, p in proposals.items() if p["batch"]["id"] == batch)
    assert "approved" in await approve("--batch", batch)  # per batch: all of its proposals
    done = await _done(dep, 1, wait_s=60)
    assert done["t-000003"]["status"] == "rejected"
    assert done["t-000003"]["reason"] == "duplicate of an open ticket"
    expected = sorted(set(same_batch) - {"t-000003"})
    for _ in range(60):
        ran = await dep.records(dep.activity_topic("lookupCustomer"))
        if len(ran) >= len(expected):
            break
        await asyncio.sleep(0.5)
    assert sorted(r["instance"] for r in ran) == expected
    assert ran[0]["call_id"] in proposals[ran[0]["instance"]]["call_ids"]


async def test_manager_example_global_instruction_reaches_only_employee_b(
    deploy: Deploy, tmp_path: Path
) -> None:
    dep = await deploy(spec_path=EXAMPLES / "manager" / "agent.yaml")
    await dep.produce(
        [
            (
                b"employee_A",
                orjson.dumps(
                    {
                        "type": "state",
                        "_instance": "employee_A",
                        "task": "Draft initial proposal",
                        "status": "In Progress",
                    }
                ),
            ),
            (
                b"employee_B",
                orjson.dumps(
                    {
                        "type": "state",
                        "_instance": "employee_B",
                        "task": "Review team submissions",
                        "status": "Blocked",
                    }
                ),
            ),
        ]
    )
    report = await dep.settle(2)
    assert report.unaccounted == 0
    no_action = await dep.records(dep.settings.topics.no_action)
    assert {n["instance"] for n in no_action} == {"employee_A"}
    assert not no_action[0]["latent"]
    # updateTask is latent and the spec has no plan: B's answer is its state update, a
    # record of its own; nothing is kept in state (the seeds: no plan, one-shot).
    (record,) = await dep.records(dep.settings.topics.state_updates)
    assert record["instance"] == "employee_B"
    (update,) = record["updates"]
    assert update["newTask"] == "Finalize the quarterly report"
    assert update["newStatus"] == "High Priority"
    assert report.state_updates == 1
    assert await workflow_states(dep) == {}


async def test_restart_mid_workflow_resumes_from_the_table(deploy: Deploy) -> None:
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    items = tickets(6)
    await dep.produce_items(items)
    report = await dep.settle(6)  # turn 1 published; no worker yet, so all awaited calls wait
    assert report.unaccounted == 0
    waiting: list[str] = []
    for _ in range(40):
        states = await workflow_states(dep)
        waiting = sorted(k for k, s in states.items() if s["status"] == "pending")
        if len(waiting) == 6:
            break
        await asyncio.sleep(0.5)
    # The precondition of what follows: the kill must come while every workflow waits.
    assert waiting == sorted(i["_instance"] for i in items), await stuck_report(dep, TOOLS)
    dep.proc.kill()  # kill -9 while every workflow waits for its results
    dep.proc.start()
    _, stop, task = await _worker(dep)
    try:
        done = await _done(dep, 6)
    finally:
        stop.set()
        await task
    assert set(done) == {i["_instance"] for i in items}, await stuck_report(dep, TOOLS)
    for rec in done.values():
        assert [t["turn"] for t in rec["trace"]] == [1, 2]  # no turn lost, none repeated
        assert "customer" in rec["state"]
    routed = await read_json(dep.bootstrap, dep.activity_topic("routeTicket"))
    assert sorted({r["instance"] for r in routed}) == sorted(done)


async def test_a_replayed_approval_approves_nothing_more(deploy: Deploy, tmp_path: Path) -> None:
    """#24's reproduction, on the seeds' lazy plan (#26): a graph is approved once, so the
    byte-identical first approval sent again is a repeat (ignored, counted), a forged one
    is dead-lettered, and the graph's last step runs exactly once."""
    lazy = _spec(
        tmp_path,
        TICKETS / "agent.yaml",
        plan={"mode": "lazy", "steps": ["look up", "route"], "maxTurns": 4},
    )
    dep = await deploy(spec_path=lazy, STREAM_DELIVERY="exactly_once")
    _, stop, task = await _worker(dep)
    topics = dep.settings.topics
    try:
        await dep.produce_items(tickets(1))
        await dep.settle(1)
        done = await dep.cli("approve", "--instance", "t-000001", STREAM_SPEC=str(lazy))
        assert done.returncode == 0, done.stderr
        routed: list[dict[str, Any]] = []
        for _ in range(120):  # the worker answers the lookups; the summary comes due; routed
            routed = await dep.records(dep.activity_topic("routeTicket"))
            if routed:
                break
            await asyncio.sleep(0.5)
        assert len(routed) == 1, await stuck_report(dep, TOOLS)
        assert [p["turn"] for p in await dep.records(topics.proposals)] == [1]  # asked once
        first: bytes | None = None
        async for rec in read_topic(dep.bootstrap, topics.approvals):
            first = rec.value
        assert first is not None and orjson.loads(first)["turn"] == 1
        forged = {"instance": "t-000001", "proposal_id": "a guess", "turn": 2, "approve": True}
        await dep.produce_to(
            topics.approvals, [(b"t-000001", first), (b"t-000001", orjson.dumps(forged))]
        )
        letters: list[dict[str, Any]] = []
        for _ in range(120):  # read in order: once the forged one is refused, both were read
            letters = [
                x
                for x in await dep.records(topics.dead_letter)
                if x["code"] == "unexpected_approval"
            ]
            if letters:
                break
            await asyncio.sleep(0.5)
        assert len(letters) == 1 and "a guess" in letters[0]["reason"], letters
        assert len(await dep.records(dep.activity_topic("routeTicket"))) == 1
        assert len(await dep.records(dep.activity_topic("lookupCustomer"))) == 1
    finally:
        stop.set()
        await task


async def test_finished_workflows_are_deleted_after_the_retention(deploy: Deploy) -> None:
    """#24: with a healthy system (no awaited call ever times out) the finished
    workflows stayed in the table and its changelog for ever."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml", STREAM_STATE_RETENTION_S="3")
    _, stop, task = await _worker(dep)
    items = tickets(4)
    names = {i["_instance"] for i in items}
    try:
        await dep.produce_items(items)
        done = await _done(dep, 4)
    finally:
        stop.set()
        await task
    assert set(done) == names, await stuck_report(dep, TOOLS)
    latest: dict[str, bytes | None] = {}
    for _ in range(60):  # retention 3 s, the expiry timer ticks every second
        latest = {}
        async for rec in read_topic(dep.bootstrap, state_changelog(dep.settings)):
            if rec.key:
                latest[rec.key.decode()] = rec.value
        if set(latest) >= names and all(latest[n] is None for n in names):
            break
        await asyncio.sleep(0.5)
    left = sorted(n for n in names if latest.get(n) is not None)
    assert not left, f"finished workflows still stored after their retention: {left}"


def test_demo_runs_the_stateful_example(bootstrap: str) -> None:
    result = demo_json(bootstrap, "--example", "tickets", "--items", "30", timeout=240)
    assert result["unaccounted"] == 0
    assert result["done"] == 26  # 30 items, 4 malformed on purpose
    assert result["turns"] == 2 * 26
    assert result["awaited_calls"] == 2 * 26 and result["results_answered"] == 2 * 26
    # #38: the page reads only the urgent branch; counted by the processor in state.
    flows = result["workflows"]
    paged = result["calls"].get("pageOnCall", 0)
    assert flows["skipped_branch"] > 0 and paged > 0
    assert flows["skipped_branch"] + paged == 26 and flows["ran_on_missing_input"] == 0


async def test_finished_workflows_leave_memory_and_are_read_back_when_asked(
    deploy: Deploy,
) -> None:
    """Issue 37: a finished workflow's state stayed in the processor's memory until its
    retention ended (a day). Now only its changelog offset stays; the same answer again
    and a new input of its instance read it back (a restart continues its trace)."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    _, stop, task = await _worker(dep)
    items = tickets(3)
    names = {i["_instance"] for i in items}
    topics = dep.settings.topics
    try:
        await dep.produce_items(items)
        done = await _done(dep, 3)
        assert set(done) == names, await stuck_report(dep, TOOLS)
        held: dict[str, int] = {}
        for _ in range(60):  # the live figures are renewed every 5 s
            live = await live_of(dep.proc)
            held = (live or {}).get("workflow_states", {})
            if held.get("retired", 0) >= 3:
                break
            await asyncio.sleep(0.5)
        assert held.get("retired") == 3 and held.get("live") == 0, held  # the precondition
        first = items[0]["_instance"]
        answer = None
        async for rec in read_topic(dep.bootstrap, topics.results):
            if orjson.loads(rec.value or b"{}")["instance"] == first:
                answer = (rec.key, rec.value)
        assert answer is not None
        await dep.produce_to(topics.results, [answer])  # the same answer again
        await dep.produce_items([{**items[0], "body": items[0]["body"] + " (reopened)"}])
        runs: list[dict[str, Any]] = []
        for _ in range(120):
            runs = [d for d in await dep.records(topics.done) if d["instance"] == first]
            if len(runs) == 2:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await task
    assert len(runs) == 2, await stuck_report(dep, TOOLS)
    # Its state was read back, not started afresh: the trace goes on from the first run.
    turns = [t["turn"] for t in runs[1]["trace"]]
    assert turns[:3] == [1, 2, 1], runs[1]["trace"]  # the first run's turns, then the new
    letters = [x for x in await dep.records(topics.dead_letter) if x["scope"] == "call"]
    assert letters == []  # the repeated answer was a repeat, not an unexpected one
    for _ in range(30):  # renewed every 5 s
        held = ((await live_of(dep.proc)) or {}).get("workflow_states", {})
        if held.get("recalled", 0) >= 1:
            break
        await asyncio.sleep(0.5)
    # Read back once: the new input found it still parsed from the repeat's read-back.
    assert held.get("recalled") == 1, held
