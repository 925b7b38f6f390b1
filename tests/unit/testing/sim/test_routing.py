"""The simulator's routing rules, read from the prompts the processor writes for the seeds'
own specs: a global instruction that names one employee gets that employee a call and
the others a NoAction (or nothing, where silence is an answer), the seed's verbatim answer
where no schema holds the keys; and a council's scores over argument-less tools."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec, ContextMessage, load_spec
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.harness.seeds import seed_items
from instanced_stream_bench.testing.sim.request import SimRequest, read_request
from instanced_stream_bench.testing.sim.routing import choose_tool, route_instruction

SRC = SourcePosition(topic="in", partition=0, offset=0)
MANAGER = EXAMPLES / "seeds" / "manager.yaml"
TASK = "Finalize the quarterly report"  # quoted in the seed's instruction


def _request(spec: AgentSpec, items: list[dict[str, Any]]) -> SimRequest:
    """The first turn's request for `items` (state messages), as the simulator reads it."""
    instances = [
        Instance(str(i["_instance"]), i, SRC, 40, {k: v for k, v in i.items() if k != "type"})
        for i in items
    ]
    builder = PromptBuilder(spec)
    return read_request(builder.messages(instances, builder.ask_for(1, False)))


def _views(req: SimRequest) -> dict[str, dict[str, Any]]:
    """Each token's state, as the judge hands it over (the state is the input too)."""
    return {
        str(i["_instance"]): {"input": {}, "state": {k: v for k, v in i.items() if k != "type"}}
        for i in req.items
    }


def _manager(**update: Any) -> AgentSpec:
    return load_spec(MANAGER).model_copy(update=update)


def test_the_employee_the_instruction_names_by_its_shown_id_gets_the_task() -> None:
    """The seed says "employee B"; the state shows `employee_B` (instance_ids: shown).
    Silence is an answer in the seed's spec: employee_A gets no call at all."""
    req = _request(_manager(), seed_items("manager"))
    tokens = {i["_id"]: i["_instance"] for i in req.items}
    (call,) = route_instruction(req, _views(req))
    assert call["_tool"] == "updateTask" and call["_instance"] == tokens["employee_B"]
    # The quoted task, and the status the instruction's "high-priority" asks for.
    assert call["newTask"] == TASK and call["newStatus"] == "High Priority"
    assert call["_outputPath"] == "†state"  # the tool's one path
    assert "employee_B" in call["_reasoningForCall"]


def test_without_silence_the_employee_not_named_gets_a_no_action() -> None:
    req = _request(_manager(silence="reask"), seed_items("manager"))
    tokens = {i["_id"]: i["_instance"] for i in req.items}
    calls = {c["_instance"]: c for c in route_instruction(req, _views(req))}
    assert calls[tokens["employee_B"]]["_tool"] == "updateTask"
    skipped = calls[tokens["employee_A"]]
    assert skipped["_tool"] == "NoAction" and skipped["reason"]


def test_where_no_schema_holds_the_keys_the_seed_s_own_answer_is_written() -> None:
    """json_object mode (the simulator marks the request free-form) and the protocol
    form: the shown id as `_instance` and the path spelled "output", as the seed writes."""
    req = replace(_request(_manager(), seed_items("manager")), free_form=True)
    assert not req.call_fields  # the precondition: the seed's protocol form
    assert route_instruction(req, _views(req)) == [
        {
            "_tool": "updateTask",
            "_instance": "employee_B",
            "newTask": TASK,
            "newStatus": "High Priority",
            "output": "†state",
        }
    ]


def test_an_instance_named_by_its_name_acts_and_the_status_stays_normal() -> None:
    instruction = ContextMessage.model_validate({"instruction": "Give Dana 'Close the books'."})
    spec = _manager(instance_ids="hidden", silence="reask", inputs=[instruction])
    people = [{"type": "state", "_instance": f"p{k}", "name": n} for k, n in enumerate("AB")]
    people.append({"type": "state", "_instance": "p2", "name": "Dana"})
    req = _request(spec, people)
    calls = route_instruction(req, _views(req))
    acted = [c for c in calls if c["_tool"] == "updateTask"]
    assert [c["newTask"] for c in acted] == ["Close the books"]
    assert acted[0]["newStatus"] == "Normal" and "Dana" in acted[0]["_reasoningForCall"]
    assert [c["_tool"] for c in calls].count("NoAction") == 2


@pytest.mark.parametrize(
    ("text", "top", "votes"),
    [
        # The Advisor seed's change, risky: its scores 10, 5, 95, as the seed writes them.
        ("passed unit tests but lacks integration tests", "delay", [10, 5, 95]),
        ("a copy edit on the landing page", "deploy", [90, 5, 10]),
    ],
)
def test_a_council_scores_each_argument_less_tool_and_the_top_one_is_called(
    text: str, top: str, votes: list[int]
) -> None:
    tools = _request(load_spec(EXAMPLES / "seeds" / "advisors.yaml"), seed_items("advisors")).tools
    names = [t["name"] for t in tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
    assert names == ["deploy", "rollback", "delay"]  # the seed's order
    assert choose_tool(tools, text) == (top, dict(zip(names, votes, strict=True)))


def test_no_council_choice_without_three_argument_less_tools() -> None:
    bare: list[dict[str, Any]] = [{"name": n} for n in ("deploy", "rollback", "delay")]
    assert choose_tool([*bare[:2], {"name": "NoAction"}], "untested") is None
    with_args = [*bare[:2], {"name": "delay", "parameters": {"properties": {"days": {}}}}]
    assert choose_tool(with_args, "untested") is None
    assert choose_tool(bare, "untested") == ("delay", {"deploy": 10, "rollback": 5, "delay": 95})
