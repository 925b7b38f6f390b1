"""The seeds' `on: finish` (core/finish.py): consulted where the loop decides whether an
instance stops (its answer proposes no further call, or its turn limit nears), per
instance; a request-wide finish advisor speaks only for a request of one instance."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.state import MemoryStore
from instanced_stream.core.validate import Opinion
from instanced_stream.core.workflow import Workflow
from instanced_stream.settings import EXAMPLES

ONE = BatchRef(id="b-1", size=1, token="①", attempt=1)
TWO = BatchRef(id="b-2", size=2, token="①", attempt=1)
SRC = SourcePosition(topic="items", partition=0, offset=0)


def _spec(max_turns: int = 4) -> AgentSpec:
    spec = load_spec(EXAMPLES / "tickets" / "agent.yaml")
    data = spec.model_dump(by_alias=True)
    data["plan"]["maxTurns"] = max_turns
    closer = {"id": "closer", "role": "r", "on": "finish"}
    return AgentSpec.model_validate({**data, "advisors": [closer]})


def _call(tool: str, **fields: Any) -> Call:
    return Call.model_validate({"_tool": tool, "_instance": "t-1", **fields})


def _flow(spec: AgentSpec) -> tuple[Workflow, Instance]:
    flow = Workflow(spec, MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert inst is not None
    return flow, inst


def _says(stop: int, go: int, token: str | None = None) -> Opinion:
    return Opinion("closer", token, {}, f'{{"stop": {stop}, "continue": {go}}}')


ROUTE = ("c-route", _call("routeTicket", queue="standard", note="n"))
NOTHING = ("c-none", _call("NoAction", reason="nothing left"))


def test_continue_keeps_an_instance_whose_answer_proposes_no_call_going() -> None:
    flow, inst = _flow(_spec())
    effects = flow.turn(inst, [NOTHING], ONE, [_says(10, 90)])
    assert effects.done is None  # the loop would have stopped; the advisor said continue
    st = flow.store.get("t-1")
    assert st is not None and st.status == "ready" and st.ended is None
    assert flow.next_turn(st) is not None and flow.next_turn(st).turn == 2  # type: ignore[union-attr]
    # without the advisor the same answer ends the workflow
    flow, inst = _flow(_spec())
    assert flow.turn(inst, [NOTHING], ONE, []).done is not None


def test_stop_mid_plan_changes_nothing_and_at_the_limit_ends_it_unrun() -> None:
    flow, inst = _flow(_spec(max_turns=4))
    effects = flow.turn(inst, [ROUTE], ONE, [_says(90, 10)])
    assert effects.dropped == {} and effects.run == ["c-route"]  # turns to spare: not asked
    flow, inst = _flow(_spec(max_turns=2))
    effects = flow.turn(inst, [ROUTE], ONE, [_says(90, 10)])
    assert effects.done is not None and effects.done.status == "stopped"
    assert effects.dropped["c-route"][0] == "stopped"


def test_a_request_wide_finish_advisor_never_judges_an_instance_of_a_larger_request() -> None:
    flow, inst = _flow(_spec(max_turns=2))
    effects = flow.turn(inst, [ROUTE], TWO, [_says(90, 10)])  # request-wide, two instances
    assert effects.done is None or effects.done.status != "stopped"
    assert "c-route" not in effects.dropped
    flow, inst = _flow(_spec(max_turns=2))
    effects = flow.turn(inst, [ROUTE], TWO, [_says(90, 10, token="①")])  # its own opinion
    assert effects.done is not None and effects.done.status == "stopped"


def test_the_model_is_told_what_a_finish_opinion_can_change() -> None:
    system = PromptBuilder(_spec()).system
    for promise in (
        "proposes no further call",
        "gives it another turn",
        "the calls of that answer are not run",
        "changes nothing",
        "holds that instance alone",
    ):
        assert promise in system.replace("\n", " "), promise
