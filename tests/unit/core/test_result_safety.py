"""A result that cannot be written must never crash the result handler."""

from __future__ import annotations

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, ResultRecord, SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.validate import Validator

from tests.flows import Rig, tickets_spec

SRC = SourcePosition(topic="items", partition=0, offset=0)
BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)


def _route_with_output() -> AgentSpec:
    """tickets, with routeTicket awaited: an `_output` schema, still no `paths`."""
    data = tickets_spec().model_dump(by_alias=True, exclude_none=True)
    for tool in data["tools"]:
        if tool["name"] == "routeTicket":
            tool["output"] = {"type": "object", "properties": {"queue": {"type": "string"}}}
    return AgentSpec.model_validate(data)


def test_the_state_root_is_refused_for_a_tool_that_declares_no_paths() -> None:
    """routeTicket declares `_output` but no `paths`: nothing promises its result is an
    object, so the model may not merge it into the whole state."""
    spec = _route_with_output()
    call = {"_tool": "routeTicket", "_instance": "①", "_outputPath": "†state"}
    answer = {"calls": [{**call, "queue": "standard", "note": "n"}]}
    verdict = Validator(spec).check(orjson.dumps(answer).decode(), ["①"])
    assert not verdict.calls
    (refusal,) = verdict.refusals
    assert refusal.code == "bad_output_path"
    assert "whole state" in refusal.reason and "routeTicket" in refusal.reason
    # A key below the root stays allowed: any value can be written there.
    keyed = {**call, "_outputPath": "†state.route", "queue": "standard", "note": "n"}
    ok = Validator(spec).check(orjson.dumps({"calls": [keyed]}).decode(), ["①"])
    assert not ok.refusals and ok.calls


def test_a_fire_and_forget_activity_keeps_nothing() -> None:
    """As tickets writes it, routeTicket declares neither `paths` nor `_output`: it is
    fire-and-forget, so an `_outputPath` on it (which would make it awaited, waiting for
    a result its activity never sends) is refused, and the schema offers only null."""
    call = {"_tool": "routeTicket", "_instance": "①", "_outputPath": "†state.route"}
    answer = {"calls": [{**call, "queue": "standard", "note": "n"}]}
    verdict = Validator(tickets_spec()).check(orjson.dumps(answer).decode(), ["①"])
    (refusal,) = verdict.refusals
    assert refusal.code == "bad_output_path" and "fire-and-forget" in refusal.reason
    spec = tickets_spec()
    protocol = spec.model_copy(
        update={"model": spec.model.model_copy(update={"answer": "protocol"})}
    )
    schema = PromptBuilder(protocol).response_format(1)["json_schema"]["schema"]
    (route,) = [
        b
        for b in schema["properties"]["calls"]["items"]["anyOf"]
        if b["properties"]["_tool"]["enum"] == ["routeTicket"]
    ]
    assert route["properties"]["_outputPath"] == {"type": "null"}


async def test_a_result_that_cannot_be_written_is_a_dead_letter_not_a_crash() -> None:
    """A pending call to †state (stored by an older version, or a forged record) whose
    result is not an object: a bad_result dead letter, the call counts as failed, the
    workflow goes on; the result handler raises nothing."""
    rig = Rig(tickets_spec())
    rig.unit(0)  # its store
    inst = rig.workflow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert inst is not None
    routed = Call.model_validate(
        {"_tool": "routeTicket", "_instance": "t-1", "_outputPath": "†state", "queue": "x"}
    )
    rig.workflow.turn(inst, [("c1", routed)], BATCH, [])
    result = ResultRecord.model_validate(
        {"call_id": "c1", "instance": "t-1", "tool": "routeTicket", "turn": 1, "value": None}
    )
    await rig.result(result.model_dump_json().encode())
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "bad_result" and "object" in letter["reason"]
    st = rig.stores.get("t-1")
    assert st is not None and "c1" in st.state["errors"] and st.status == "ready"
    assert rig.offsets(rig.topics.results) == {0: 1}
    await rig.drain()  # the workflow goes on: its next turn
    (looked,) = rig.on("activity.lookupCustomer")
    assert looked["turn"] == 2
