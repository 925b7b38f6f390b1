"""A two-turn workflow in memory (tests/flows.py): fake LLM (the simulator's planner), the
unit runtime's stores and commits."""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import orjson
import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, ResultRecord, SourcePosition
from instanced_stream.core.spec import Advisor, AgentSpec, load_spec
from instanced_stream.core.state import MemoryStore
from instanced_stream.core.validate import Opinion
from instanced_stream.core.workflow import Workflow
from instanced_stream_bench.testing.samples import tickets

from tests.flows import TICKETS, Rig


async def test_two_turns_where_turn_two_uses_turn_one_results() -> None:
    rig = Rig(load_spec(TICKETS))
    for ticket in tickets(3):
        await rig.offer(orjson.dumps(ticket))
    await rig.drain()
    assert rig.offsets() == {0: 3}  # turn 1 is committed: the inputs are done with
    looked = rig.on("activity.lookupCustomer")
    urgency = rig.on("activity.assessUrgency")
    assert len(looked) == len(urgency) == 3
    assert all(r["call"]["_outputPath"] == "†state.customer" for r in looked)
    assert all(r["call"]["_outputPath"] == "†state.urgent || †state.routine" for r in urgency)
    assert all(r["context"][-1]["customer"] for r in looked)  # scoped to its own input
    assert not rig.on("activity.routeTicket") and not rig.on("stream.done")
    assert not [r for r in rig.records if "think" in r.topic or "summarize" in r.topic]
    first = rig.stores.get("t-000001")
    assert first is not None and first.status == "pending" and len(first.pending) == 2
    # The latent summary is in state now, or (where the simulator made it read the
    # awaited customer) due for turn 2: in state at the end, either way.
    for rec in looked:
        answer = ResultRecord(
            call_id=rec["call_id"],
            instance=rec["instance"],
            tool="lookupCustomer",
            turn=rec["turn"],
            value={"vip": rec["instance"] == "t-000002"},
        )
        await rig.result(answer.model_dump_json().encode())
    for rec in urgency:
        answer = ResultRecord(
            call_id=rec["call_id"],
            instance=rec["instance"],
            tool="assessUrgency",
            turn=rec["turn"],
            value={"why": "test"},
            path="†state.urgent" if rec["instance"] == "t-000003" else "†state.routine",
        )
        await rig.result(answer.model_dump_json().encode())
    # a repeated result is ignored: an activity worker delivers at least once
    await rig.result(answer.model_dump_json().encode())
    assert rig.workflow.results_ignored == 1
    assert rig.offsets(rig.topics.results) == {0: 7}  # the repeat is committed, unapplied
    await rig.drain()
    routed = {r["instance"]: r for r in rig.on("activity.routeTicket")}
    assert set(routed) == {"t-000001", "t-000002", "t-000003"}
    assert routed["t-000002"]["call"]["queue"] == "priority"  # vip, learnt in turn 1
    assert routed["t-000003"]["call"]["queue"] == "priority"  # urgent branch
    assert routed["t-000001"]["call"]["queue"] == "standard"
    assert routed["t-000001"]["turn"] == 2 and "/t2/" in routed["t-000001"]["call_id"]
    assert [t["turn"] for t in routed["t-000001"]["trace"]] == [1, 2]
    done = {d["instance"]: d for d in rig.on("stream.done")}
    assert set(done) == set(routed) and all(d["status"] == "done" for d in done.values())
    assert done["t-000003"]["state"]["urgent"] == {"why": "test"}
    assert all(d["state"]["summary"]["summary"].startswith("notes:") for d in done.values())
    assert "routine" not in done["t-000003"]["state"]
    assert "thought" not in orjson.dumps(done).decode()  # a thought is never stored


async def test_unlisted_branch_is_refused_and_recorded() -> None:
    rig = Rig(load_spec(TICKETS))
    await rig.offer(orjson.dumps(tickets(1)[0]))
    await rig.drain()
    rec = rig.on("activity.assessUrgency")[0]
    bad = ResultRecord(
        call_id=rec["call_id"],
        instance=rec["instance"],
        tool="assessUrgency",
        turn=1,
        value=1,
        path="†state.somewhereElse",
    )
    await rig.result(bad.model_dump_json().encode())
    st = rig.stores.get(rec["instance"])
    assert st is not None and "somewhereElse" not in st.state
    assert "not one of" in st.state["errors"][rec["call_id"]]


def _started(spec: AgentSpec, store: MemoryStore, timeout: float = 60) -> Workflow:
    flow = Workflow(spec, store, pending_timeout_s=timeout)
    src = SourcePosition(topic="items", partition=0, offset=0)
    flow.admit(Instance("t-1", {"customer": "acme"}, src, 10))
    return flow


def _call(tool: str, path: str | None = None) -> Call:
    data: dict[str, Any] = {"_tool": tool, "_instance": "t-1", "reason": "r"}
    if path:
        data["_outputPath"] = path
    return Call.model_validate(data)


BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)


def test_a_late_result_is_recorded_as_an_error_and_the_loop_goes_on() -> None:
    store = MemoryStore()
    flow = _started(load_spec(TICKETS), store, timeout=0.01)
    inst = Instance(
        "t-1",
        {"customer": "acme"},
        SourcePosition(topic="items", partition=0, offset=0),
        10,
        None,
        1,
    )
    turn = flow.turn(inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    assert turn.run == ["c1"] and turn.done is None
    ((nxt, done),) = flow.expire(time.time() + 1)
    st = store.get("t-1")
    assert st is not None and "timed out" in st.state["errors"]["c1"]
    assert done is None and nxt is not None and nxt.turn == 2  # the workflow goes on
    assert flow.expired == 1


def test_turn_limit_and_a_finish_advisor_end_the_workflow() -> None:
    base = load_spec(TICKETS)
    assert base.plan is not None
    limited = base.model_copy(update={"plan": base.plan.model_copy(update={"max_turns": 1})})
    store = MemoryStore()
    flow = _started(limited, store)
    inst = Instance("t-1", {}, SourcePosition(topic="items", partition=0, offset=0), 10)
    flow.turn(inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    nxt, done = flow.on_result(
        ResultRecord(call_id="c1", instance="t-1", tool="lookupCustomer", turn=1, value={})
    )
    assert nxt is None and done is not None and done.status == "turn_limit"

    closer = Advisor.model_validate({"id": "closer", "role": "r", "on": "finish"})
    stop = Opinion(advisor="closer", token=None, fields={}, votes_raw='{"stop": 90, "go": 10}')
    # turns to spare and a call proposed: the loop decides nothing here, the stop waits
    store = MemoryStore()
    flow = _started(base.model_copy(update={"advisors": [closer]}), store)
    turn = flow.turn(inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [stop])
    assert turn.done is None and store.get("t-1").status == "pending"  # type: ignore[union-attr]
    near = base.plan.model_copy(update={"max_turns": 2})  # turn 1 is the one before the last
    stoppable = base.model_copy(update={"advisors": [closer], "plan": near})
    store = MemoryStore()
    flow = _started(stoppable, store)
    turn = flow.turn(inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [stop])
    # it awaited a call, but its turn limit nears and the finish advisor voted stop
    assert turn.done is not None and turn.done.status == "stopped"
    st = store.get("t-1")
    assert st is not None and st.pending == {} and st.status == "done"


def test_a_result_that_breaks_its_output_schema_is_named_each_time() -> None:
    flow = _started(load_spec(TICKETS), MemoryStore())
    src = SourcePosition(topic="items", partition=0, offset=0)
    inst = Instance("t-1", {"customer": "acme"}, src, 10, None, 1)
    flow.turn(inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    bad = ResultRecord(
        call_id="c1", instance="t-1", tool="lookupCustomer", turn=1, value={"vip": "yes"}
    )
    for _ in range(2):  # the second check uses the validator the first one built
        problem = flow.result_problem(bad)
        assert problem is not None and "lookupCustomer result breaks" in problem
        assert "at vip" in problem
    good = bad.model_copy(update={"value": {"plan": "pro", "vip": True}})
    assert flow.result_problem(good) is None


def test_a_finish_advisor_from_the_context_topic_is_heard_by_the_workflow() -> None:
    rig = Rig(load_spec(TICKETS))
    rig.unit(0)  # its store
    closer = Advisor.model_validate({"id": "closer", "role": "r", "on": "finish"})
    spec = rig.workflow.spec
    assert spec.plan is not None  # its last turn but one: where the loop decides
    near = spec.plan.model_copy(update={"max_turns": 2})
    rig.live.install(spec.model_copy(update={"advisors": [closer], "plan": near}))
    src = SourcePosition(topic="items", partition=0, offset=0)
    inst = rig.workflow.admit(Instance("t-1", {"customer": "acme"}, src, 10))
    assert inst is not None
    stop = Opinion(advisor="closer", token=None, fields={}, votes_raw='{"stop": 90, "go": 10}')
    turn = rig.workflow.turn(
        inst, [("c1", _call("lookupCustomer", "†state.customer"))], BATCH, [stop]
    )
    assert turn.done is not None and turn.done.status == "stopped"


async def _answer_turn_one(rig: Rig, count: int = 1) -> str:
    """Tickets' first turns committed and their calls answered: their second turns are
    offered, and wait in the open window. Returns the first ticket's instance."""
    for ticket in tickets(count):
        await rig.offer(orjson.dumps(ticket))
    await rig.drain()
    calls = [*rig.on("activity.lookupCustomer"), *rig.on("activity.assessUrgency")]
    for rec in calls:
        path = "†state.routine" if rec["call"]["_tool"] == "assessUrgency" else None
        answer = ResultRecord(
            call_id=rec["call_id"],
            instance=rec["instance"],
            tool=rec["call"]["_tool"],
            turn=rec["turn"],
            value={"vip": False},
            path=path,
        )
        await rig.result(answer.model_dump_json().encode())
    return str(calls[0]["instance"])


@pytest.mark.parametrize("launched_first", [True, False])
async def test_a_turn_queued_when_its_partition_moves_runs_when_it_comes_back(
    launched_first: bool,
) -> None:
    """Issue 37: a next turn sitting in the open window when its unit is revoked used to
    keep its instance in the stager's queued turns, so the next owner here never ran it."""
    rig = Rig(load_spec(TICKETS))
    instance = await _answer_turn_one(rig)
    assert len(rig.stager.windower) == 1  # the precondition: turn 2 is queued, not run
    await rig.revoke(0)
    if launched_first:  # its window closed before the partition came back: nothing staged
        await rig.drain()
        assert not rig.on("activity.routeTicket")
    unit, ready = rig.reopen(0)
    assert [inst.id for inst in ready] == [instance]
    await rig.turns([(unit, inst) for inst in ready])
    await rig.drain()
    routed = rig.on("activity.routeTicket")
    assert [r["instance"] for r in routed] == [instance] and routed[0]["turn"] == 2
    assert [d["instance"] for d in rig.on("stream.done")] == [instance]
    assert not rig.stager.queued_turns.by_instance  # nothing left queued for a unit that is gone


async def test_finished_workflows_leave_memory_when_they_end() -> None:
    """Issue 37: a finished workflow's state stayed parsed in memory until its retention
    (a day). Now it is kept compressed only, and still deleted when its retention ends."""
    tracemalloc.start()  # before the states are made: what the store holds is traced
    try:
        rig = Rig(load_spec(TICKETS), retention_s=5)
        assert rig.flows is not None
        changelog = rig.flows.changelog
        count = 40
        await _answer_turn_one(rig, count)
        await rig.drain()
        assert len(rig.on("stream.done")) == count  # the precondition: every one ended
        store = rig.stores.by_partition[0]
        assert len(store) == count
        kept = [orjson.loads(r.value or b"") for r in rig.records if r.topic == changelog]
        json_size = sum(len(orjson.dumps(k)) for k in kept[-count:]) / count
        # What the store holds: what dropping it frees (the JSON itself is also held by
        # the fake producer's records, so a store that kept only that would free little).
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        rig.stores.drop(0)
        del store
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_state = (before - after) / count
    assert per_state < json_size, (per_state, json_size)  # parsed, it was ~14 KB a state
    # Still there for what reads a finished state, until its retention ends.
    reopened, _ = rig.reopen(0)
    first = rig.stores.get("t-000001")
    assert first is not None and first.status == "done" and first.state["customer"]
    assert await rig.expire(time.time() + 10) == []
    tombstones = {r.key for r in rig.records if r.topic == changelog and not r.value}
    assert len(tombstones) == count and len(rig.stores.by_partition[0]) == 0
    assert reopened.held
