"""#24 item 5: approvals and results bind to what they answer; state arrives only from
the processor's own turns and results unless the spec opts in to state input."""

from __future__ import annotations

from typing import Any

import orjson

from instanced_stream.core.messages import SourcePosition
from instanced_stream.ops.approvals import pending_proposals
from instanced_stream.runtime.processor import Pipeline
from instanced_stream.testing.samples import tickets
from tests.fakes import FakePublisher
from tests.flows import drain, lazy, on, pipeline, tickets_spec


def _approval(proposal: dict[str, Any], approve: bool = True) -> bytes:
    return orjson.dumps(
        {
            "instance": proposal["instance"],
            "proposal_id": proposal.get("proposal_id"),
            "turn": proposal["turn"],
            "approve": approve,
        }
    )


async def _proposed() -> tuple[Pipeline, FakePublisher, dict[str, Any]]:
    """A lazy tickets workflow whose first turn is proposed."""
    pipe, pub, _ = pipeline(lazy(tickets_spec()))
    await pipe.start()
    src = SourcePosition(topic="items", partition=0, offset=0)
    await pipe.offer(orjson.dumps(tickets(1)[0]), None, src, lambda: None)
    await drain(pipe)
    (proposal,) = on(pub, "proposals")
    return pipe, pub, proposal


async def _answer_all(pipe: Pipeline, pub: FakePublisher, tool: str, value: Any) -> None:
    for rec in on(pub, f"activity.{tool}"):
        result = {
            "call_id": rec["call_id"],
            "instance": rec["instance"],
            "tool": tool,
            "turn": rec["turn"],
            "value": value,
        }
        if tool == "assessUrgency":
            result["path"] = "†state.routine"
        await pipe.on_result(orjson.dumps(result), None)


async def test_a_graph_is_approved_once_and_runs_in_dependency_order() -> None:
    """The seeds' lazy plan: the model's graph is proposed once, approved as a whole, and
    run step by step as the state its steps read comes in; the latent step is answered
    by the model only after approval, and a replayed approval approves nothing more."""
    pipe, pub, first = await _proposed()
    assert first["proposal_id"] and first["turn"] == 1
    steps = {s["tool"]: s for s in first["plan"]}
    assert steps["summarize"]["status"] == "proposed"
    assert "summary" not in first["calls"][[c["_tool"] for c in first["calls"]].index("summarize")]
    approval = _approval(first)
    await pipe.on_approval(approval, None)
    assert on(pub, "activity.lookupCustomer") and on(pub, "activity.assessUrgency")
    assert not on(pub, "activity.routeTicket")  # it reads what the others write
    await _answer_all(pipe, pub, "lookupCustomer", {"plan": "pro", "vip": False})
    await _answer_all(pipe, pub, "assessUrgency", {"why": "test"})
    await drain(pipe)
    assert len(on(pub, "proposals")) == 1  # approval is asked once per graph
    await pipe.on_approval(approval, None)  # the same approval again: a repeat
    assert len(on(pub, "activity.routeTicket")) == 1
    (done,) = on(pub, "done")
    assert done["status"] == "done" and done["state"]["summary"]
    assert pipe.workflow is not None
    st = pipe.workflow.store.get(first["instance"])
    assert st is not None and all(s.status == "done" for s in st.plan)
    await pipe.windower.stop()


async def test_an_approval_that_names_no_pending_proposal_is_a_dead_letter() -> None:
    pipe, pub, first = await _proposed()
    forged = {**first, "proposal_id": "items/0/0/t9/proposal", "turn": 9}
    await pipe.on_approval(_approval(forged), None)
    assert not on(pub, "activity.lookupCustomer")  # nothing ran
    (letter,) = on(pub, "deadletter")
    assert letter["code"] == "unexpected_approval" and first["proposal_id"] in letter["reason"]
    # An approval that names no proposal at all (the old wire form) is refused too.
    await pipe.on_approval(orjson.dumps({"instance": first["instance"], "approve": True}), None)
    assert not on(pub, "activity.lookupCustomer")
    assert [x["code"] for x in on(pub, "deadletter")][-1] == "unexpected_approval"
    await pipe.windower.stop()


async def test_a_result_must_name_a_pending_call_and_its_turn() -> None:
    pipe, pub, _ = pipeline(tickets_spec())
    await pipe.start()
    src = SourcePosition(topic="items", partition=0, offset=0)
    await pipe.offer(orjson.dumps(tickets(1)[0]), None, src, lambda: None)
    await drain(pipe)
    (call,) = on(pub, "activity.lookupCustomer")
    result = {"call_id": call["call_id"], "instance": call["instance"], "tool": "lookupCustomer"}
    value = {"plan": "pro", "vip": True}
    await pipe.on_result(orjson.dumps({**result, "turn": 2, "value": value}), None)
    await pipe.on_result(orjson.dumps({**result, "call_id": "made/up/1", "turn": 1}), None)
    letters = on(pub, "deadletter")
    assert [x["code"] for x in letters] == ["unexpected_result", "unexpected_result"]
    assert "turn 1" in letters[0]["reason"] and "made/up/1" in letters[1]["reason"]
    assert pipe.workflow is not None
    st = pipe.workflow.store.get(call["instance"])
    assert st is not None and call["call_id"] in st.pending and "customer" not in st.state
    await pipe.on_result(orjson.dumps({**result, "turn": 1, "value": value}), None)
    st = pipe.workflow.store.get(call["instance"])
    assert st is not None and st.state["customer"] == value
    # The same result again (a redelivery) is a repeat, ignored without a dead letter.
    await pipe.on_result(orjson.dumps({**result, "turn": 1, "value": value}), None)
    assert len(on(pub, "deadletter")) == 2 and pipe.workflow.results_ignored == 1
    await pipe.windower.stop()


async def test_state_input_is_refused_unless_the_spec_opts_in() -> None:
    record = orjson.dumps({"_instance": "t-1", "type": "state", "vip": True})
    src = SourcePosition(topic="items", partition=0, offset=0)
    pipe, pub, store = pipeline(tickets_spec())
    await pipe.start()
    await pipe.offer(record, None, src, lambda: None)
    await drain(pipe)
    (letter,) = on(pub, "deadletter")
    assert letter["code"] == "state_input_refused" and "accept_state_input" in letter["reason"]
    assert store.get("t-1") is None
    await pipe.windower.stop()
    opted = tickets_spec().model_copy(update={"accept_state_input": True})
    pipe, pub, store = pipeline(opted)
    await pipe.start()
    await pipe.offer(record, None, src, lambda: None)
    await drain(pipe)
    st = store.get("t-1")
    assert st is not None and st.state["vip"] is True
    assert not on(pub, "deadletter")
    await pipe.windower.stop()


def test_stream_approve_offers_only_what_is_pending_now() -> None:
    def proposal(instance: str, turn: int, offset: int = 0) -> dict[str, Any]:
        pid = f"items/0/{offset}/t{turn}/proposal"
        src = {"topic": "items", "partition": 0, "offset": offset}
        return {"instance": instance, "turn": turn, "proposal_id": pid, "source": src}

    proposals = [
        proposal("a", 1),
        proposal("a", 2),  # supersedes a's turn 1
        proposal("b", 1, 1),  # answered below
        proposal("c", 1, 2),  # its workflow ended (rejected elsewhere, or expired)
        proposal("d", 1, 3),
    ]
    approvals = [{"instance": "b", "proposal_id": "items/0/1/t1/proposal", "turn": 1}]
    ended = {"topic": "items", "partition": 0, "offset": 2}
    done = [{"instance": "c", "turns": 1, "source": ended}]
    pending = pending_proposals(proposals, approvals, done)
    assert {p["instance"]: p["turn"] for p in pending} == {"a": 2, "d": 1}
    # A done record of an earlier input of the same instance ends nothing pending now.
    restarted = [*proposals, proposal("c", 1, 9)]
    pending = pending_proposals(restarted, approvals, done)
    assert {p["instance"]: p["turn"] for p in pending} == {"a": 2, "c": 1, "d": 1}
    # A proposal from before the binding (no id) cannot be answered: not offered.
    legacy = {k: v for k, v in proposal("e", 1, 4).items() if k != "proposal_id"}
    assert "e" not in {p["instance"] for p in pending_proposals([legacy], [], [])}
