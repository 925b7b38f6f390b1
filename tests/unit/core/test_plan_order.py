"""A plan runs as its graph says. An eager step that reads what
another step of the same answer awaits waits for that result; after a branching step,
only the taken branch's readers run, the others are skipped and counted."""

from __future__ import annotations

from typing import Any

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import (
    ApprovalRecord,
    BatchRef,
    Call,
    ResultRecord,
    SourcePosition,
)
from instanced_stream.core.plan_graph import (
    RAN_ON_MISSING_INPUT,
    SKIPPED_BRANCH,
    Step,
    advance,
)
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import Change, MemoryStore
from instanced_stream.core.validate import Opinion
from instanced_stream.core.workflow import Workflow
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.settings import Settings

from tests.flows import lazy, tickets_spec

SRC = SourcePosition(topic="items", partition=0, offset=7)
BATCH = BatchRef(id="b", size=1, token="①", attempt=1)


def _call(tool: str, **fields: Any) -> Call:
    return Call.model_validate({"_tool": tool, "_instance": "t1", **fields})


def _answer() -> list[tuple[str, Call]]:
    """The tickets example's first eager turn with the on-call page reading one branch."""
    return [
        ("c-look", _call("lookupCustomer", reason="r", _outputPath="†state.customer",
                         _scopes=["input"])),
        ("c-urg", _call("assessUrgency", reason="r",
                        _outputPath="†state.urgent || †state.routine", _scopes=["input"])),
        ("c-sum", _call("summarize", summary="s", _outputPath="†state.summary")),
        ("c-page", _call("pageOnCall", message="m", _scopes=["†state.urgent"])),
    ]  # fmt: skip


def _started() -> tuple[Workflow, Instance, list[str]]:
    flow = Workflow(tickets_spec(), MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    effects = flow.turn(inst, _answer(), BATCH, [])
    return flow, inst, effects.run


def _result(call_id: str, tool: str, path: str, value: Any) -> ResultRecord:
    return ResultRecord(
        call_id=call_id, instance="t1", tool=tool, turn=1, path=path, value=value, source=SRC
    )


def test_an_eager_step_waits_for_the_result_it_reads() -> None:
    flow, _, run = _started()
    assert run == ["c-look", "c-urg"]  # the page reads what assessUrgency awaits
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    assert flow.take_launched("t1") == []  # not what it reads
    flow.on_result(_result("c-urg", "assessUrgency", "†state.urgent", {"why": "outage"}))
    (page,) = flow.take_launched("t1")
    assert page["call_id"] == "c-page" and page["_tool"] == "pageOnCall"
    st = flow.store.get("t1")
    assert st is not None and st.status == "ready"
    assert st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0 and SKIPPED_BRANCH not in st.counts


def test_a_step_on_the_branch_not_taken_is_skipped_and_counted() -> None:
    flow, _, _ = _started()
    flow.on_result(_result("c-urg", "assessUrgency", "†state.routine", {"why": "no impact"}))
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    assert flow.take_launched("t1") == []
    st = flow.store.get("t1")
    assert st is not None
    page = next(s for s in st.plan if s.tool == "pageOnCall")
    assert page.status == "skipped" and page.skipped_for == "branch"
    assert st.counts == {SKIPPED_BRANCH: 1}
    assert st.status == "ready"  # the turn ended: nothing waits for the skipped step


def test_a_failed_producer_skips_its_reader_without_calling_it_a_branch() -> None:
    flow, _, _ = _started()
    flow.on_result(
        ResultRecord(call_id="c-urg", instance="t1", tool="assessUrgency", turn=1, error="down")
    )
    st = flow.store.get("t1")
    assert st is not None
    page = next(s for s in st.plan if s.tool == "pageOnCall")
    assert page.status == "skipped" and page.skipped_for == "failed_input"
    assert SKIPPED_BRANCH not in st.counts


def _graph(*steps: tuple[str, str | None, list[str]]) -> list[Step]:
    return [
        Step(call_id=f"c{k}", tool=tool, kind="activity", output=out, inputs=ins,
             status="approved")
        for k, (tool, out, ins) in enumerate(steps)
    ]  # fmt: skip


def test_lazy_readers_follow_the_branch_taken_and_a_whole_state_reader_runs_either_way() -> None:
    graph = _graph(
        ("assess", "†state.urgent || †state.routine", []),
        ("page", None, ["†state.urgent"]),
        ("escalate", "†state.ticket", ["†state.urgent.why"]),
        ("close", None, ["†state.ticket"]),  # reads only the skipped step's output
        ("route", None, ["†state"]),  # reads the branch taken too
    )
    counts: dict[str, int] = {}
    assert [s.tool for s in advance(graph, {}, counts)] == ["assess"]
    graph[0].status, graph[0].wrote = "done", "†state.routine"
    started = advance(graph, {"routine": {"why": "x"}}, counts)
    assert [s.tool for s in started] == ["route"]
    assert [s.status for s in graph[1:4]] == ["skipped"] * 3
    assert counts == {SKIPPED_BRANCH: 3}


def test_a_reader_started_without_its_input_is_counted() -> None:
    """The guard: a producer marked done whose output is not in the state."""
    graph = _graph(("look", "†state.customer", []), ("route", None, ["†state.customer"]))
    graph[0].status, graph[0].wrote = "done", "†state.customer"
    counts: dict[str, int] = {}
    advance(graph, {}, counts)
    assert counts == {RAN_ON_MISSING_INPUT: 1}
    graph[1].status = "approved"
    counts = {}
    advance(graph, {"customer": {"vip": True}}, counts)
    assert counts == {}


def test_a_lazy_plan_skips_the_untaken_branch_after_approval() -> None:
    spec = lazy(tickets_spec())
    flow = Workflow(spec, MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    effects = flow.turn(inst, _answer(), BATCH, [])
    assert effects.proposal is not None and effects.run == []
    st = flow.store.get("t1")
    assert st is not None
    approval = ApprovalRecord(instance="t1", proposal_id=st.proposal_id, turn=1, approve=True)
    run, _ = flow.on_approval(approval)
    assert [c["_tool"] for c in run] == ["lookupCustomer", "assessUrgency"]
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    flow.on_result(_result("c-urg", "assessUrgency", "†state.routine", {"why": "no"}))
    assert [c["_tool"] for c in flow.take_launched("t1")] == []
    st = flow.store.get("t1")
    assert st is not None
    assert {s.tool: s.status for s in st.plan}["pageOnCall"] == "skipped"
    assert st.counts == {SKIPPED_BRANCH: 1}


def _revisable(max_revisions: int) -> Workflow:
    spec = lazy(tickets_spec())
    assert spec.plan is not None
    plan = spec.plan.model_copy(update={"max_revisions": max_revisions})
    return Workflow(spec.model_copy(update={"plan": plan}), MemoryStore(), pending_timeout_s=60)


def _reject(flow: Workflow, reason: str) -> Any:
    st = flow.store.get("t1")
    assert st is not None and st.status == "awaiting_approval"
    rec = ApprovalRecord(
        instance="t1", proposal_id=st.proposal_id, turn=st.turn, approve=False, reason=reason
    )
    return flow.on_approval(rec)


def test_a_rejected_plan_is_planned_again_with_its_reason_up_to_max_revisions() -> None:
    """#38 item 3: the seed's lazy mode is a checkpoint for human approval: a rejection
    with a reason is planned again (plan.maxRevisions), each version in the history."""
    flow = _revisable(1)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    first = flow.turn(inst, _answer(), BATCH, []).proposal
    assert first is not None and first.history == []
    _, done = _reject(flow, "page only after the customer is known")
    assert done is None
    st = flow.store.get("t1")
    assert st is not None
    again = flow.next_turn(st)
    assert again is not None and again.turn == 2 and again.plan is None
    assert again.rejected is not None
    assert again.rejected[0]["reason"] == "page only after the customer is known"
    builder = PromptBuilder(flow.spec)
    ask = builder.ask_for(again.turn, bool(again.rejected))
    assert ask.planning  # latent steps carry no arguments again
    assert '"type":"rejected"' in builder.messages([again], ask)[1]["content"]
    assert '"rejected" versions' in builder.system
    second = flow.turn(again, _answer(), BATCH, []).proposal
    assert second is not None and second.proposal_id != first.proposal_id
    assert [v["proposal_id"] for v in second.history] == [first.proposal_id]
    assert second.history[0]["steps"] == first.plan
    _, done = _reject(flow, "still no")
    assert done is not None and done.status == "rejected" and done.reason == "still no"


def test_without_max_revisions_a_rejection_ends_the_workflow() -> None:
    flow = _revisable(0)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    flow.turn(inst, _answer(), BATCH, [])
    _, done = _reject(flow, "no")
    assert done is not None and done.status == "rejected"
    assert '"rejected" versions' not in PromptBuilder(flow.spec).system


def test_a_held_eager_step_keeps_its_turn_s_gate_verdict() -> None:
    """The page waits for assessUrgency; the council voted clearly against it, so when
    it goes out it goes to review, as it would have with the answer."""
    spec = tickets_spec()
    judge = {"id": "judge", "role": "r", "on": "request", "isInstanced": True}
    spec = AgentSpec.model_validate(
        {**spec.model_dump(by_alias=True), "advisors": [judge], "advice": {"mode": "gate"}}
    )
    flow = Workflow(spec, MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    inst_state = flow.store.get("t1")
    votes = Opinion("judge", "①", {}, '{"pageOnCall": 5, "routeTicket": 95}')
    answer = Answer(inst, [c for _, c in _answer()], "①", 1, 1, [votes])
    topics = Settings(bootstrap_servers="unused:9092").topics
    builder = RecordBuilder(LiveSpec(spec), topics, "m")
    change = Change(flow.store)
    planned = builder.batch("b", Outcome(answers=[answer]), flow.over(change))
    assert not [
        r for r in planned.records if r.topic in (topics.review, topics.activity("pageOnCall"))
    ]
    assert flow.store.get("t1") == inst_state  # the turn is made on the change only
    (write,) = change.take()
    assert write.state is not None
    flow.store.put(write.state)
    st = flow.store.get("t1")
    assert st is not None
    (urgency,) = [s.call_id for s in st.plan if s.tool == "assessUrgency"]
    flow.on_result(_result(urgency, "assessUrgency", "†state.urgent", {"why": "outage"}))
    launched = flow.take_launched("t1")
    st = flow.store.get("t1")
    assert st is not None and [c["_tool"] for c in launched] == ["pageOnCall"]
    out = builder.approved(st, launched, "w")
    (held,) = [orjson.loads(r.value or b"") for r in out.records]
    assert [r.topic for r in out.records] == [topics.review]
    assert "against the council" in held["review"] and "_review" not in held["call"]
