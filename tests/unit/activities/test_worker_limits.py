"""Records over the broker's limit are dead-lettered, by the activity worker
(its results) and by the processor (results its state cannot hold, and their letters),
instead of crashing either."""

from __future__ import annotations

from typing import Any

import orjson
from instanced_stream.activities.worker import Activities
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import (
    ActivityRecord,
    BatchRef,
    Call,
    ResultRecord,
    SourcePosition,
)
from instanced_stream.core.spec import Tool
from instanced_stream.settings import Settings

from tests.fakes import FakePublisher
from tests.flows import Rig, tickets_spec

SRC = SourcePosition(topic="items", partition=0, offset=0)
BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)
LIMIT = 2048


def _record() -> bytes:
    call = Call.model_validate(
        {"_tool": "lookupCustomer", "_instance": "t-1", "_outputPath": "†state.customer"}
    )
    rec = ActivityRecord(
        call_id="c1",
        tool="lookupCustomer",
        instance="t-1",
        call=call,
        source=SRC,
        batch=BATCH,
        model="m",
    )
    return rec.model_dump_json(by_alias=True).encode()


def _worker() -> tuple[Activities, Tool]:
    acts = Activities()

    @acts.activity("lookupCustomer")
    async def huge(call: Call, tool: Tool, context: list[dict[str, Any]]) -> Any:
        return {"plan": "x" * 5000, "vip": True}

    tool = tickets_spec().tool("lookupCustomer")
    assert tool is not None
    return acts, tool


async def test_an_oversized_result_is_dead_lettered_and_the_workflow_told() -> None:
    acts, tool = _worker()
    settings = Settings(bootstrap_servers="unused:9092", max_output_bytes=LIMIT)
    pub = FakePublisher()
    await acts.serve_one(_record(), tool, settings, pub)
    assert all(len(r.value) <= LIMIT for r in pub.records)
    (letter,) = [orjson.loads(r.value) for r in pub.records if r.topic.endswith("deadletter")]
    assert letter["code"] == "too_large" and str(LIMIT) in letter["reason"]
    # The awaited call fails now, instead of at its deadline.
    (result,) = [orjson.loads(r.value) for r in pub.records if r.topic.endswith("results")]
    assert result["call_id"] == "c1" and "too large" in result["error"]
    assert result.get("value") is None


async def test_a_result_the_broker_refuses_does_not_stop_the_worker() -> None:
    acts, tool = _worker()
    settings = Settings(bootstrap_servers="unused:9092")  # our limit passes it
    pub = FakePublisher()
    pub.refuse_next = 1  # ... and the broker refuses it
    await acts.serve_one(_record(), tool, settings, pub)  # raised PublishError: the worker died
    (letter,) = [orjson.loads(r.value) for r in pub.records if r.topic.endswith("deadletter")]
    assert letter["code"] == "too_large" and "refused" in letter["reason"]
    (result,) = [orjson.loads(r.value) for r in pub.records if r.topic.endswith("results")]
    assert result["error"] and "refused" in result["error"]


async def test_a_last_result_over_the_limit_is_refused_and_the_workflow_ends() -> None:
    """Its state (and so its done record, which holds no more than the state) would pass
    the limit: the result is dead-lettered, its call failed, and the workflow ends now,
    not at the call's deadline."""
    base = tickets_spec()
    assert base.plan is not None
    spec = base.model_copy(update={"plan": base.plan.model_copy(update={"max_turns": 1})})
    rig = Rig(spec, max_output_bytes=LIMIT)
    rig.unit(0)  # its store
    inst = rig.workflow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert inst is not None
    call = Call.model_validate(
        {"_tool": "lookupCustomer", "_instance": "t-1", "_outputPath": "†state.customer"}
    )
    rig.workflow.turn(inst, [("c1", call)], BATCH, [])
    big = ResultRecord.model_validate(
        {
            "call_id": "c1",
            "instance": "t-1",
            "tool": "lookupCustomer",
            "turn": 1,
            "value": {"plan": "x" * 5000, "vip": True},
        }
    )
    await rig.result(big.model_dump_json().encode())  # turn limit: done
    assert all(len(r.value or b"") <= LIMIT for r in rig.records)
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "too_large" and str(LIMIT) in letter["reason"]
    assert "state of t-1" in letter["reason"] and letter["call"]["call_id"] == "c1"
    st = await rig.state("t-1")
    assert st is not None and st.status == "done"  # it ended all the same
    assert str(LIMIT) in st.state["errors"]["c1"] and "customer" not in st.state
    (done,) = rig.on("stream.done")
    assert done["status"] == "turn_limit"
    assert rig.offsets(rig.topics.results) == {0: 1}


async def test_a_bad_result_letter_over_the_limit_is_refused_too() -> None:
    """The bad_result letter carries the value: a huge value that breaks `_output`
    must not make a letter the broker refuses."""
    rig = Rig(tickets_spec(), max_output_bytes=LIMIT)
    rig.unit(0)  # its store
    inst = rig.workflow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert inst is not None
    call = Call.model_validate(
        {"_tool": "lookupCustomer", "_instance": "t-1", "_outputPath": "†state.customer"}
    )
    rig.workflow.turn(inst, [("c1", call)], BATCH, [])
    value = {"plan": "x" * 5000, "vip": "yes"}  # vip must be a boolean
    bad = {"call_id": "c1", "instance": "t-1", "tool": "lookupCustomer", "turn": 1}
    await rig.result(orjson.dumps({**bad, "value": value}))
    assert all(len(r.value or b"") <= LIMIT for r in rig.records)
    assert [x["code"] for x in rig.on("deadletter")] == ["too_large"]
    st = rig.stores.get("t-1")
    assert st is not None and "breaks its _output" in st.state["errors"]["c1"]
