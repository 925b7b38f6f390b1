"""A plan runs in its graph's order, whatever order the answer lists its calls in: a
reader written before its producer waits for it (eager and lazy, latent steps included),
a reader of a failed producer never runs and is counted, and a graph that cannot run (a
cycle, a read of what nothing writes) is refused with a reason the re-ask carries."""

from __future__ import annotations

from typing import Any

import pytest
from instanced_stream.core.instance import Instance
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
    SKIPPED_INPUT,
    Step,
    advance,
    problem,
)
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.state import MemoryStore
from instanced_stream.core.validate import BAD_PLAN, Validator
from instanced_stream.core.workflow import Workflow

from tests.flows import lazy, tickets_spec

SRC = SourcePosition(topic="items", partition=0, offset=7)
BATCH = BatchRef(id="b", size=1, token="①", attempt=1)


def _call(tool: str, **fields: Any) -> Call:
    return Call.model_validate({"_tool": tool, "_instance": "t1", **fields})


PAGE = ("c-page", _call("pageOnCall", message="m", _scopes=["†state.urgent"]))
URGENCY = (
    "c-urg",
    _call("assessUrgency", reason="r", _outputPath="†state.urgent || †state.routine"),
)
LOOKUP = ("c-look", _call("lookupCustomer", reason="r", _outputPath="†state.customer"))
# A latent intermediary: reads what the lookup awaits, writes what routeTicket reads.
SUMMARY = (
    "c-sum",
    _call("summarize", summary="guess", _outputPath="†state.summary",
          _scopes=["†state.customer"]),
)  # fmt: skip
ROUTE = ("c-route", _call("routeTicket", queue="standard", note="n", _scopes=["†state.summary"]))


def _flow(spec: Any = None) -> tuple[Workflow, Instance]:
    flow = Workflow(spec or tickets_spec(), MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    return flow, inst


def _result(call_id: str, tool: str, path: str | None, value: Any, turn: int = 1) -> ResultRecord:
    return ResultRecord(
        call_id=call_id, instance="t1", tool=tool, turn=turn, path=path, value=value, source=SRC
    )


def test_an_eager_reader_listed_before_its_producer_waits_for_it() -> None:
    """The issue's first probe: pageOnCall first, then the assessUrgency it reads. It
    must not go out with the answer, and goes out only on the urgent branch."""
    flow, inst = _flow()
    run = flow.turn(inst, [PAGE, URGENCY], BATCH, []).run
    assert run == ["c-urg"]
    st = flow.store.get("t1")
    assert st is not None and st.counts == {}
    flow.on_result(_result("c-urg", "assessUrgency", "†state.urgent", {"why": "outage"}))
    assert [c["call_id"] for c in flow.take_launched("t1")] == ["c-page"]
    st = flow.store.get("t1")
    assert st is not None and st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0


def test_an_eager_reader_listed_first_is_skipped_on_the_branch_not_taken() -> None:
    flow, inst = _flow()
    flow.turn(inst, [PAGE, URGENCY], BATCH, [])
    flow.on_result(_result("c-urg", "assessUrgency", "†state.routine", {"why": "minor"}))
    assert flow.take_launched("t1") == []
    st = flow.store.get("t1")
    assert st is not None and st.counts == {SKIPPED_BRANCH: 1}


def test_a_latent_intermediary_waits_for_its_input_and_is_answered_again() -> None:
    """summarize reads the awaited customer: its guess is not written; routeTicket (read
    first in the answer) reads the summary, so it waits for the summary, which the model
    answers on the next turn, once the customer is known."""
    flow, inst = _flow()
    # A latent step reading nothing awaited is written with the answer, whatever its place.
    note = ("c-think", _call("summarize", summary="at once", _outputPath="†state.first"))
    effects = flow.turn(inst, [ROUTE, SUMMARY, LOOKUP, note], BATCH, [])
    assert effects.run == ["c-look"]
    st = flow.store.get("t1")
    assert st is not None and "summary" not in st.state
    assert st.state["first"] == {"summary": "at once"}
    nxt, done = flow.on_result(
        _result("c-look", "lookupCustomer", "†state.customer", {"vip": True})
    )
    assert done is None and flow.take_launched("t1") == []
    assert nxt is not None and nxt.plan is not None
    assert {s.get("_outputPath"): s["status"] for s in nxt.plan}["†state.summary"] == "due"
    # The next turn answers the due step; the route held since turn 1 goes out with it.
    answer = [("t2-sum", _call("summarize", summary="vip outage", _outputPath="†state.summary"))]
    effects = flow.turn(nxt, answer, BATCH, [])
    assert [c["call_id"] for c in effects.launch] == ["c-route"]
    st = flow.store.get("t1")
    assert st is not None and st.state["summary"] == {"summary": "vip outage"}
    assert st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0
    assert [(s.tool, s.status) for s in st.plan] == [
        ("routeTicket", "done"),
        ("summarize", "done"),
        ("lookupCustomer", "done"),
        ("summarize", "done"),
    ]


def test_a_reader_of_a_failed_producer_does_not_run_and_the_workflow_says_so() -> None:
    flow, inst = _flow()
    flow.turn(inst, [PAGE, URGENCY], BATCH, [])
    nxt, _ = flow.on_result(
        ResultRecord(call_id="c-urg", instance="t1", tool="assessUrgency", turn=1, error="down")
    )
    assert flow.take_launched("t1") == []
    st = flow.store.get("t1")
    assert st is not None and st.counts == {SKIPPED_INPUT: 1}
    assert nxt is not None
    # The model then makes no more awaited calls: the done record names the lost step.
    done = flow.turn(nxt, [("t2", _call("routeTicket", queue="standard", note="n"))], BATCH, [])
    assert done.done is not None
    assert "1 steps not run: a step they read failed" in str(done.done.reason)


def test_a_lazy_reader_listed_first_runs_after_its_producer() -> None:
    flow, inst = _flow(lazy(tickets_spec()))
    effects = flow.turn(inst, [PAGE, URGENCY, LOOKUP], BATCH, [])
    assert effects.proposal is not None
    st = flow.store.get("t1")
    assert st is not None
    approval = ApprovalRecord(instance="t1", proposal_id=st.proposal_id, turn=1, approve=True)
    run, _ = flow.on_approval(approval)
    assert [c["_tool"] for c in run] == ["assessUrgency", "lookupCustomer"]
    flow.on_result(_result("c-urg", "assessUrgency", "†state.urgent", {"why": "outage"}))
    # A lazy graph moves on once every result it awaits is in.
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    assert [c["_tool"] for c in flow.take_launched("t1")] == ["pageOnCall"]
    st = flow.store.get("t1")
    assert st is not None and st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0


def _graph(*steps: tuple[str, str | None, list[str]]) -> list[Step]:
    return [
        Step(call_id=f"c{k}", tool=tool, kind="activity", output=out, inputs=ins,
             status="approved")
        for k, (tool, out, ins) in enumerate(steps)
    ]  # fmt: skip


def test_ran_on_missing_input_reads_the_state_not_the_answer_order() -> None:
    """The guard counts a step started while a step of its graph that writes what it reads
    has not: listed later in the answer included (it used to look only earlier)."""
    graph = _graph(("page", None, ["†state.urgent"]), ("assess", "†state.urgent", []))
    graph[0].status = "approved"
    counts: dict[str, int] = {}
    # Force the reader's start as an order bug would: its producer marked done, no output.
    graph[1].status, graph[1].wrote = "done", "†state.urgent"
    advance(graph, {}, counts)
    assert counts == {RAN_ON_MISSING_INPUT: 1}


def test_a_cycle_and_a_read_of_nothing_are_refused_with_why() -> None:
    a = _graph(("a", "†state.x", ["†state.y"]), ("b", "†state.y", ["†state.x"]))
    why = problem(a, {})
    assert why is not None and "cycle" in why and ("a -> b -> a" in why or "b -> a -> b" in why)
    nothing = _graph(("route", None, ["†state.summary"]))
    why = problem(nothing, {})
    assert why is not None and "route reads †state.summary" in why
    assert problem(nothing, {"summary": "known"}) is None  # the state holds it
    assert problem(_graph(("x", "†state.a", ["†state"])), {}) is None  # the whole state
    assert problem(_graph(("x", "†state.a", ["†state.a"])), {}) is None  # its own output


def test_the_validator_refuses_a_graph_that_cannot_run_and_the_instance_is_asked_again() -> None:
    """A refused producer (bad arguments) leaves its reader reading nothing: the reader's
    instance is refused as a whole (`bad_plan`) and asked again, never run anyway."""
    spec = tickets_spec().model_copy(update={"model": tickets_spec().model.model_copy(
        update={"answer": "protocol"})})  # fmt: skip
    answer = (
        '{"calls": ['
        '{"_tool": "pageOnCall", "_instance": "①", "message": "m", "_scopes": ["†state.urgent"]},'
        '{"_tool": "assessUrgency", "_instance": "①", "reason": 5,'
        ' "_outputPath": "†state.urgent || †state.routine"},'
        '{"_tool": "routeTicket", "_instance": "②", "queue": "standard", "note": "n",'
        ' "_scopes": ["†state.customer"]}'
        "]}"
    )
    verdict = Validator(spec).check(answer, ["①", "②"], states={"②": {"customer": {}}})
    assert "①" not in verdict.calls and [c.tool for c in verdict.calls["②"]] == ["routeTicket"]
    codes = sorted(r.code for r in verdict.refusals)
    assert codes == ["bad_arguments", BAD_PLAN]
    (plan,) = [r for r in verdict.refusals if r.code == BAD_PLAN]
    assert plan.token == "①" and "pageOnCall reads †state.urgent" in plan.reason


@pytest.mark.parametrize("answer", ["compact", "protocol"])
def test_the_eager_prompt_says_the_graph_decides_the_order(answer: str) -> None:
    spec = tickets_spec()
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"answer": answer})})
    system = PromptBuilder(spec).system
    assert "Steps run in the order of what they read, not of the answer" in system
    assert 'answer the latent steps whose status is "due" first' in system
