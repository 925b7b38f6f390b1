"""A plan runs in its graph's order, whatever order the answer lists its calls in: a
reader waits for its producer (eager and lazy, latent steps included, listed before or
after it), a reader on the branch not taken or of a failed producer never runs and is
counted, a held step keeps its turn's gate verdict, and a graph that cannot run (a
cycle, a read of what nothing writes) is refused with a reason the re-ask carries."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
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
    SKIPPED_INPUT,
    Step,
    advance,
    problem,
)
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import Change, MemoryStore
from instanced_stream.core.validate import BAD_PLAN, Opinion, Validator
from instanced_stream.core.workflow import Workflow
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.settings import Settings

from tests.flows import lazy, tickets_spec, tickets_turn

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


# The first probe, the page listed before the assessUrgency it reads; and the
# example's turn written producers first (tests/flows.py): what goes out with the answer.
ORDERS = {
    "reader_first": ([PAGE, URGENCY], ["c-urg"]),
    "producers_first": (tickets_turn(), ["c-look", "c-urg"]),
}


def _flow(spec: Any = None) -> tuple[Workflow, Instance]:
    flow = Workflow(spec or tickets_spec(), MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    return flow, inst


def _started(order: str) -> tuple[Workflow, list[str]]:
    """The first eager turn in `order`, checked to start just what it reads nothing
    awaited for: the page is not among them."""
    answer, expected = ORDERS[order]
    flow, inst = _flow()
    run = flow.turn(inst, answer, BATCH, []).run
    assert run == expected
    st = flow.store.get("t1")
    assert st is not None and st.counts == {}
    return flow, run


def _result(call_id: str, tool: str, path: str | None, value: Any, turn: int = 1) -> ResultRecord:
    return ResultRecord(
        call_id=call_id, instance="t1", tool=tool, turn=turn, path=path, value=value, source=SRC
    )


def _customer_known(flow: Workflow, run: list[str]) -> None:
    if "c-look" in run:
        flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))


@pytest.mark.parametrize("order", ORDERS)
def test_an_eager_reader_waits_for_its_producer_wherever_it_is_listed(order: str) -> None:
    """It does not go out with the answer, and goes out once the result it reads is in,
    on the urgent branch."""
    flow, run = _started(order)
    _customer_known(flow, run)
    assert flow.take_launched("t1") == []  # not what it reads
    flow.on_result(_result("c-urg", "assessUrgency", "†state.urgent", {"why": "outage"}))
    (page,) = flow.take_launched("t1")
    assert page["call_id"] == "c-page" and page["_tool"] == "pageOnCall"
    st = flow.store.get("t1")
    assert st is not None and st.status == "ready"
    assert st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0 and SKIPPED_BRANCH not in st.counts


@pytest.mark.parametrize("order", ORDERS)
def test_an_eager_reader_on_the_branch_not_taken_is_skipped_and_counted(order: str) -> None:
    flow, run = _started(order)
    flow.on_result(_result("c-urg", "assessUrgency", "†state.routine", {"why": "no impact"}))
    _customer_known(flow, run)
    assert flow.take_launched("t1") == []
    st = flow.store.get("t1")
    assert st is not None
    page = next(s for s in st.plan if s.tool == "pageOnCall")
    assert page.status == "skipped" and page.skipped_for == "branch"
    assert st.counts == {SKIPPED_BRANCH: 1}
    assert st.status == "ready"  # the turn ended: nothing waits for the skipped step


@pytest.mark.parametrize("order", ORDERS)
def test_a_reader_of_a_failed_producer_does_not_run_and_the_workflow_says_so(order: str) -> None:
    """Skipped for its failed input, not called a branch; once the turn is over and the
    model makes no more awaited calls, the done record names the lost step."""
    flow, run = _started(order)
    nxt, _ = flow.on_result(
        ResultRecord(call_id="c-urg", instance="t1", tool="assessUrgency", turn=1, error="down")
    )
    if "c-look" in run:
        nxt, _ = flow.on_result(
            _result("c-look", "lookupCustomer", "†state.customer", {"vip": False})
        )
    assert flow.take_launched("t1") == []
    st = flow.store.get("t1")
    assert st is not None and st.counts == {SKIPPED_INPUT: 1}
    page = next(s for s in st.plan if s.tool == "pageOnCall")
    assert page.status == "skipped" and page.skipped_for == "failed_input"
    assert nxt is not None
    done = flow.turn(nxt, [("t2", _call("routeTicket", queue="standard", note="n"))], BATCH, [])
    assert done.done is not None
    assert "1 steps not run: a step they read failed" in str(done.done.reason)


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


def _two_path_summary() -> AgentSpec:
    """The tickets spec with a latent tool that may write either of two paths."""
    spec = tickets_spec()
    tools = [
        t.model_copy(update={"paths": ["†state.summary", "†state.notes"]})
        if t.name == "summarize"
        else t
        for t in spec.tools
    ]
    return spec.model_copy(update={"tools": tools})


def test_a_latent_branch_collapses_to_its_first_path_on_the_eager_turn() -> None:
    """The seeds' update: on the first eager turn a latent call's `a || b` collapses to
    one path as the model writes it; a reader of the other is skipped as on a branch."""
    flow, inst = _flow(_two_path_summary())
    note = ("c-note", _call("summarize", summary="s", _outputPath="†state.summary || †state.notes"))
    on_notes = (
        "c-route",
        _call("routeTicket", queue="standard", note="n", _scopes=["†state.notes"]),
    )
    effects = flow.turn(inst, [on_notes, note, LOOKUP], BATCH, [])
    assert effects.run == ["c-look"]  # the route reads the path not taken: never run
    st = flow.store.get("t1")
    assert st is not None and st.state["summary"] == {"summary": "s"} and "notes" not in st.state
    assert {s.tool: (s.status, s.skipped_for) for s in st.plan}["routeTicket"] == (
        "skipped",
        "branch",
    )
    assert st.counts[SKIPPED_BRANCH] == 1 and st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0


def test_a_later_turn_answering_a_due_latent_branch_names_the_path_it_takes() -> None:
    """A latent branch step that waited for its input is answered on a later turn: the
    answer's own `_outputPath` names the alternative taken there."""
    flow, inst = _flow(_two_path_summary())
    note = (
        "c-note",
        _call("summarize", summary="guess", _outputPath="†state.summary || †state.notes",
              _scopes=["†state.customer"]),
    )  # fmt: skip
    on_summary = (
        "c-route",
        _call("routeTicket", queue="standard", note="n", _scopes=["†state.summary"]),
    )
    flow.turn(inst, [note, on_summary, LOOKUP], BATCH, [])
    nxt, _ = flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": True}))
    assert nxt is not None
    answer = [("t2-note", _call("summarize", summary="vip", _outputPath="†state.notes"))]
    effects = flow.turn(nxt, answer, BATCH, [])
    assert effects.launch == []  # the route read the summary, which was not written
    st = flow.store.get("t1")
    assert st is not None and st.state["notes"] == {"summary": "vip"} and "summary" not in st.state
    assert st.counts[SKIPPED_BRANCH] == 1


def _approved(flow: Workflow, inst: Instance, answer: list[tuple[str, Call]]) -> list[str]:
    """A lazy turn proposed (nothing runs before approval), approved as a whole: the
    tools that start."""
    effects = flow.turn(inst, answer, BATCH, [])
    assert effects.proposal is not None and effects.run == []
    st = flow.store.get("t1")
    assert st is not None
    approval = ApprovalRecord(instance="t1", proposal_id=st.proposal_id, turn=1, approve=True)
    run, _ = flow.on_approval(approval)
    return [c["_tool"] for c in run]


def test_a_lazy_reader_listed_first_runs_after_its_producer() -> None:
    flow, inst = _flow(lazy(tickets_spec()))
    assert _approved(flow, inst, [PAGE, URGENCY, LOOKUP]) == ["assessUrgency", "lookupCustomer"]
    flow.on_result(_result("c-urg", "assessUrgency", "†state.urgent", {"why": "outage"}))
    # A lazy graph moves on once every result it awaits is in.
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    assert [c["_tool"] for c in flow.take_launched("t1")] == ["pageOnCall"]
    st = flow.store.get("t1")
    assert st is not None and st.counts.get(RAN_ON_MISSING_INPUT, 0) == 0


def test_a_lazy_plan_skips_the_untaken_branch_after_approval() -> None:
    flow, inst = _flow(lazy(tickets_spec()))
    assert _approved(flow, inst, tickets_turn()) == ["lookupCustomer", "assessUrgency"]
    flow.on_result(_result("c-look", "lookupCustomer", "†state.customer", {"vip": False}))
    flow.on_result(_result("c-urg", "assessUrgency", "†state.routine", {"why": "no"}))
    assert [c["_tool"] for c in flow.take_launched("t1")] == []
    st = flow.store.get("t1")
    assert st is not None
    assert {s.tool: s.status for s in st.plan}["pageOnCall"] == "skipped"
    assert st.counts == {SKIPPED_BRANCH: 1}


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


@pytest.mark.parametrize(
    ("steps", "reader", "producer", "path"),
    [
        # Listed before its producer: the guard reads the state, not the answer order (it
        # used to look only at steps listed earlier).
        ((("page", None, ["†state.urgent"]), ("assess", "†state.urgent", [])), 0, 1, "urgent"),
        ((("look", "†state.customer", []), ("route", None, ["†state.customer"])), 1, 0, "customer"),
    ],
)
def test_a_reader_started_without_its_input_is_counted_wherever_it_is_listed(
    steps: tuple[tuple[str, str | None, list[str]], ...], reader: int, producer: int, path: str
) -> None:
    """The guard counts a step started while a step of its graph that writes what it reads
    has not: forced as an order bug would, its producer marked done with no output in the
    state. With the output in the state, nothing is counted."""
    graph = _graph(*steps)
    graph[producer].status, graph[producer].wrote = "done", f"†state.{path}"
    counts: dict[str, int] = {}
    advance(graph, {}, counts)
    assert counts == {RAN_ON_MISSING_INPUT: 1}
    graph[reader].status = "approved"
    counts = {}
    advance(graph, {path: {"known": True}}, counts)
    assert counts == {}


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


def test_a_held_eager_step_keeps_its_turn_s_gate_verdict() -> None:
    """The page waits for assessUrgency; the council voted clearly against it, so when
    it goes out it goes to review, as it would have with the answer."""
    spec = tickets_spec()
    judge = {"id": "judge", "role": "r", "on": "request", "isInstanced": True}
    spec = AgentSpec.model_validate(
        {**spec.model_dump(by_alias=True), "advisors": [judge], "advice": {"mode": "gate"}}
    )
    flow, inst = _flow(spec)
    before = flow.store.get("t1")
    votes = Opinion("judge", "①", {}, '{"pageOnCall": 5, "routeTicket": 95}')
    answer = Answer(inst, [c for _, c in tickets_turn()], "①", 1, 1, [votes])
    topics = Settings(bootstrap_servers="unused:9092").topics
    builder = RecordBuilder(LiveSpec(spec), topics, "m")
    change = Change(flow.store)
    planned = builder.batch("b", Outcome(answers=[answer]), flow.over(change))
    assert not [
        r for r in planned.records if r.topic in (topics.review, topics.activity("pageOnCall"))
    ]
    assert flow.store.get("t1") == before  # the turn is made on the change only
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
