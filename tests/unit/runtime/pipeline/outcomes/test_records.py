"""Every call ends published, as an explicit no-action, or as a dead
letter with a reason; a thought (a latent call without `_outputPath`) is never published.
Read from the records a solved batch (or a workflow's turn) produces."""

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
    StateUpdateRecord,
)
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import Change, MemoryStore
from instanced_stream.core.validate import Opinion, Validator
from instanced_stream.core.workflow import Workflow
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.settings import Settings

from tests.flows import lazy, tickets_spec

TOPICS = Settings(bootstrap_servers="unused:9092").topics
SRC = SourcePosition(topic="items", partition=0, offset=3)


def _planless() -> AgentSpec:
    """One-shot (no plan): a latent tool with a path, a thought, and an activity."""
    return AgentSpec.model_validate(
        {
            "name": "p",
            "instructions": "decide",
            "model": {"answer": "protocol"},
            "tools": [
                {"name": "note", "kind": "latent", "description": "n", "paths": ["†state.task"]},
                {
                    "name": "think",
                    "kind": "latent",
                    "description": "t",
                    "parameters": {
                        "type": "object",
                        "properties": {"thought": {"type": "string"}},
                    },
                },
                {"name": "notify", "description": "a"},
            ],
        }
    )


def _call(tool: str, **fields: Any) -> Call:
    return Call.model_validate({"_tool": tool, "_instance": "a", **fields})


def _records(spec: AgentSpec, *calls: Call) -> dict[str, list[dict[str, Any]]]:
    inst = Instance("a", {"text": "x"}, SRC, 10)
    answer = Answer(inst, list(calls), "①", 1, 1)
    planned = RecordBuilder(LiveSpec(spec), TOPICS, "m").batch("b", Outcome(answers=[answer]), None)
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in planned.records:
        out.setdefault(rec.topic, []).append(orjson.loads(rec.value or b"{}"))
    return out


THOUGHT = {"thought": "the customer sounds angry; SECRET-THOUGHT"}
NOTE = {"task": "call back", "_outputPath": "†state.task"}


def test_a_planless_latent_output_rides_on_the_activity_record() -> None:
    """Item 4: the prompt promises the output "goes in this instance's outcome"."""
    out = _records(_planless(), _call("note", **NOTE), _call("notify"))
    (activity,) = out[TOPICS.activity("notify")]
    (note,) = activity["latent"]
    assert note["_tool"] == "note" and note["task"] == "call back"
    assert TOPICS.no_action not in out


def test_a_thought_is_never_published() -> None:
    """Item 5: only latent calls, one a thought: the instance took no action; the record
    says so and carries the output, never the thought's text."""
    out = _records(_planless(), _call("think", **THOUGHT), _call("note", **NOTE))
    (update,) = out[TOPICS.state_updates]  # the note is a state update; the thought no part
    assert [c["_tool"] for c in update["updates"]] == ["note"]
    assert TOPICS.no_action not in out
    alone = _records(_planless(), _call("think", **THOUGHT))
    (no_action,) = alone[TOPICS.no_action]
    assert no_action["latent"] == [] and no_action["reason"] == "only latent calls"
    for records in (out, alone):
        assert b"SECRET-THOUGHT" not in orjson.dumps(records)
    with_call = _records(_planless(), _call("think", **THOUGHT), _call("notify"))
    assert b"SECRET-THOUGHT" not in orjson.dumps(with_call)


def _turn(flow: Workflow, turn: int, calls: list[tuple[str, Call]], ops: list[Opinion]) -> Any:
    inst = Instance("a", {"text": "x"}, SRC, 10, turn=turn)
    return flow.turn(inst, calls, BatchRef(id="b", size=1, token="①", attempt=1), ops)


def test_a_call_outside_the_approved_graph_is_a_dead_letter() -> None:
    """Item 4: a lazy plan's follow-up call that is no due step is not run, and says so."""
    flow = Workflow(lazy(tickets_spec()), MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("a", {"text": "x"}, SRC, 10))
    assert inst is not None
    planned = [
        ("c-sum", _call("summarize", _outputPath="†state.summary")),
        ("c-look", _call("lookupCustomer", reason="r", _outputPath="†state.customer")),
    ]
    _turn(flow, 1, planned, [])
    st = flow.store.get("a")
    assert st is not None
    flow.on_approval(ApprovalRecord(instance="a", proposal_id=st.proposal_id, turn=1, approve=True))
    flow.on_result(
        _result("c-look", "lookupCustomer", "†state.customer", {"plan": "p", "vip": False})
    )
    follow = [
        ("t2-sum", _call("summarize", summary="s", _outputPath="†state.summary")),
        ("t2-route", _call("routeTicket", queue="standard", note="n")),
        ("t2-think", _call("think", thought="hm")),
    ]
    effects = _turn(flow, 2, follow, [])
    assert effects.dropped.keys() == {"t2-route"}  # the due step is answered; a thought is none
    assert effects.dropped["t2-route"][0] == "outside_plan"


def _result(cid: str, tool: str, path: str, value: Any) -> ResultRecord:
    return ResultRecord(call_id=cid, instance="a", tool=tool, turn=1, path=path, value=value)


def test_a_finish_stop_records_the_calls_it_does_not_run() -> None:
    """Item 4: the stop vote ends the workflow; that answer's calls are dead letters
    `stopped`, and the model was told they will not run."""
    spec = tickets_spec()
    finish = {"id": "closer", "role": "r", "on": "finish"}
    data = spec.model_dump(by_alias=True)
    data["plan"]["maxTurns"] = 2  # turn 1 is the one before the last: the loop decides
    spec = AgentSpec.model_validate({**data, "advisors": [finish]})
    flow = Workflow(spec, MemoryStore(), pending_timeout_s=60)
    inst = flow.admit(Instance("a", {"text": "x"}, SRC, 10))
    assert inst is not None
    stop = Opinion("closer", None, {}, '{"stop": 90, "continue": 10}')
    calls = [_call("routeTicket", queue="standard", note="n"), _call("think", thought="hm")]
    answer = Answer(inst, calls, "①", 1, 1, [stop])
    builder = RecordBuilder(LiveSpec(spec), TOPICS, "m")
    planned = builder.batch("b", Outcome(answers=[answer]), flow.over(Change(flow.store)))
    topics = [r.topic for r in planned.records]
    assert TOPICS.activity("routeTicket") not in topics
    (letter,) = [
        orjson.loads(r.value or b"") for r in planned.records if r.topic == TOPICS.dead_letter
    ]
    assert letter["code"] == "stopped" and letter["call"]["_tool"] == "routeTicket"
    (done,) = [orjson.loads(r.value or b"") for r in planned.records if r.topic == TOPICS.done]
    assert done["status"] == "stopped"
    assert "the calls of that answer are not run" in PromptBuilder(spec).system


def test_any_number_of_thoughts_per_instance_and_a_refused_one_keeps_no_text() -> None:
    """#45 item 2: two thoughts for one instance are multi-step reasoning, not a
    duplicate_call; a thought refused for its arguments is a dead letter without its text."""
    spec = _planless()
    answer = orjson.dumps(
        {
            "calls": [
                {"_tool": "think", "_instance": "①", "thought": "first SECRET-THOUGHT"},
                {"_tool": "think", "_instance": "①", "thought": "second SECRET-THOUGHT"},
                {"_tool": "notify", "_instance": "①"},
                {"_tool": "think", "_instance": "②", "thought": ["SECRET-THOUGHT"]},
                {"_tool": "notify", "_instance": "②"},
            ]
        }
    ).decode()
    verdict = Validator(spec).check(answer, ["①", "②"])
    assert [c.tool for c in verdict.calls["①"]] == ["think", "think", "notify"]
    (refused,) = verdict.refusals
    assert refused.code == "bad_arguments" and refused.token == "②"
    inst = Instance("a", {"text": "x"}, SRC, 10)
    outcome = Outcome(
        answers=[Answer(inst, verdict.calls["①"], "①", 2, 1)], refusals=[(refused, inst, 1)]
    )
    planned = RecordBuilder(LiveSpec(spec), TOPICS, "m").batch("b", outcome, None)
    (letter,) = [r for r in planned.records if r.topic == TOPICS.dead_letter]
    assert orjson.loads(letter.value or b"")["call"] == {"_tool": "think", "_instance": "②"}
    assert b"SECRET-THOUGHT" not in b"".join(r.value or b"" for r in planned.records)
    assert "SECRET" not in orjson.dumps(planned.decisions).decode()  # the live page


def test_a_planless_answer_of_only_state_writes_is_the_instance_s_state_update() -> None:
    """#54: the Instancing seed's manager answer (a latent call writing †state, no plan)
    was recorded as "no action"; it is the instance's state update, a record of its own."""
    out = _records(_planless(), _call("note", **NOTE))
    assert TOPICS.no_action not in out
    (update,) = out[TOPICS.state_updates]
    assert update["instance"] == "a" and update["turn"] == 1
    (note,) = update["updates"]
    assert note["_tool"] == "note" and note["task"] == "call back"
    assert note["_outputPath"].startswith("†state")
    StateUpdateRecord.model_validate(update)  # the schema in schemas/ holds it


def test_a_planless_latent_output_beside_a_no_action_is_on_its_record() -> None:
    """#45 item 3: the output was on no record when the answer also said NoAction."""
    out = _records(_planless(), _call("note", **NOTE), _call("NoAction", reason="nothing"))
    (no_action,) = out[TOPICS.no_action]
    assert no_action["reason"] == "nothing"
    assert [c["task"] for c in no_action["latent"]] == ["call back"]


def test_a_finish_stop_without_a_plan_runs_none_of_the_answer_s_calls() -> None:
    """#45 item 4: the prompt's FINISH note says a stop's calls are not run; without a
    plan (no workflow) they were published anyway."""
    spec = _planless()
    finish = {"id": "closer", "role": "r", "on": "finish"}
    spec = AgentSpec.model_validate({**spec.model_dump(by_alias=True), "advisors": [finish]})
    assert "the calls of that answer are not run" in PromptBuilder(spec).system
    inst = Instance("a", {"text": "x"}, SRC, 10)
    calls = [_call("notify"), _call("note", **NOTE), _call("think", **THOUGHT)]
    stop = Opinion("closer", None, {}, '{"stop": 90, "continue": 10}')
    planned = RecordBuilder(LiveSpec(spec), TOPICS, "m").batch(
        "b", Outcome(answers=[Answer(inst, calls, "①", 1, 1, [stop])]), None
    )
    topics = [r.topic for r in planned.records]
    assert TOPICS.activity("notify") not in topics
    letters = [
        orjson.loads(r.value or b"") for r in planned.records if r.topic == TOPICS.dead_letter
    ]
    assert sorted((d["code"], d["call"]["_tool"]) for d in letters) == [
        ("stopped", "note"),
        ("stopped", "notify"),
    ]
    assert letters[0]["call"] and b"SECRET-THOUGHT" not in b"".join(
        r.value or b"" for r in planned.records
    )
    go = Opinion("closer", None, {}, '{"stop": 10, "continue": 90}')
    planned = RecordBuilder(LiveSpec(spec), TOPICS, "m").batch(
        "b", Outcome(answers=[Answer(inst, calls, "①", 1, 1, [go])]), None
    )
    assert TOPICS.activity("notify") in [r.topic for r in planned.records]


def test_a_record_refused_before_it_had_an_instance_keeps_its_producers_key() -> None:
    from instanced_stream.errors import BadRecord
    from instanced_stream.runtime.pipeline.outcomes.letters import bad_record

    builder = RecordBuilder(LiveSpec(tickets_spec()), TOPICS, "m")
    keyed = SourcePosition(topic="items", partition=0, offset=4, key="order-17")
    framed = b"\x00\x00\x00\x00\x07truncated"
    refused = BadRecord("unknown_schema", "schema id 7 is not in the registry")
    (record,) = builder.letter(bad_record(refused, keyed, framed)).records
    assert record.topic == TOPICS.dead_letter and record.key == b"order-17"
    assert orjson.loads(record.value)["source"]["key"] == "order-17"
    (unkeyed,) = builder.letter(bad_record(refused, SRC, framed)).records
    assert unkeyed.key is None
