"""Approvals and results bind to what they answer; state arrives only from
the processor's own turns and results unless the spec opts in to state input."""

from __future__ import annotations

from typing import Any

import orjson
from instanced_stream.ops.approvals import pending_proposals
from instanced_stream_bench.testing.samples import tickets

from tests.flows import Rig, lazy, tickets_spec


def _approval(proposal: dict[str, Any], approve: bool = True) -> bytes:
    return orjson.dumps(
        {
            "instance": proposal["instance"],
            "proposal_id": proposal.get("proposal_id"),
            "turn": proposal["turn"],
            "approve": approve,
        }
    )


async def _proposed() -> tuple[Rig, dict[str, Any]]:
    """A lazy tickets workflow whose first turn is proposed."""
    rig = Rig(lazy(tickets_spec()))
    await rig.offer(orjson.dumps(tickets(1)[0]))
    await rig.drain()
    (proposal,) = rig.on("proposals")
    return rig, proposal


async def _answer_all(rig: Rig, tool: str, value: Any) -> None:
    for rec in rig.on(f"activity.{tool}"):
        result = {
            "call_id": rec["call_id"],
            "instance": rec["instance"],
            "tool": tool,
            "turn": rec["turn"],
            "value": value,
        }
        if tool == "assessUrgency":
            result["path"] = "†state.routine"
        await rig.result(orjson.dumps(result))


async def test_a_graph_is_approved_once_and_runs_in_dependency_order() -> None:
    """The seeds' lazy plan: the model's graph is proposed once, approved as a whole, and
    run step by step as the state its steps read comes in; the latent step is answered
    by the model only after approval, and a replayed approval approves nothing more."""
    rig, first = await _proposed()
    assert first["proposal_id"] and first["turn"] == 1
    steps = {s["tool"]: s for s in first["plan"]}
    assert steps["summarize"]["status"] == "proposed"
    assert "summary" not in first["calls"][[c["_tool"] for c in first["calls"]].index("summarize")]
    approval = _approval(first)
    await rig.approval(approval)
    assert rig.on("activity.lookupCustomer") and rig.on("activity.assessUrgency")
    assert not rig.on("activity.routeTicket")  # it reads what the others write
    await _answer_all(rig, "lookupCustomer", {"plan": "pro", "vip": False})
    await _answer_all(rig, "assessUrgency", {"why": "test"})
    await rig.drain()
    assert len(rig.on("proposals")) == 1  # approval is asked once per graph
    await rig.approval(approval)  # the same approval again: a repeat
    assert len(rig.on("activity.routeTicket")) == 1
    (done,) = rig.on("done")
    assert done["status"] == "done" and done["state"]["summary"]
    st = rig.stores.get(first["instance"])
    assert st is not None
    # Routine: the on-call page reads only the urgent branch, so it is skipped, counted.
    assert {s.tool for s in st.plan if s.status != "done"} == {"pageOnCall"}
    assert st.counts == {"skipped_branch": 1} and not rig.on("activity.pageOnCall")


async def test_an_approval_that_names_no_pending_proposal_is_a_dead_letter() -> None:
    rig, first = await _proposed()
    forged = {**first, "proposal_id": "items/0/0/t9/proposal", "turn": 9}
    await rig.approval(_approval(forged))
    assert not rig.on("activity.lookupCustomer")  # nothing ran
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "unexpected_approval" and first["proposal_id"] in letter["reason"]
    # An approval that names no proposal at all (the old wire form) is refused too.
    await rig.approval(orjson.dumps({"instance": first["instance"], "approve": True}))
    assert not rig.on("activity.lookupCustomer")
    assert [x["code"] for x in rig.on("deadletter")][-1] == "unexpected_approval"
    assert rig.offsets(rig.topics.approvals) == {0: 2}  # refused, and done with


async def test_a_result_must_name_a_pending_call_and_its_turn() -> None:
    rig = Rig(tickets_spec())
    await rig.offer(orjson.dumps(tickets(1)[0]))
    await rig.drain()
    (call,) = rig.on("activity.lookupCustomer")
    result = {"call_id": call["call_id"], "instance": call["instance"], "tool": "lookupCustomer"}
    value = {"plan": "pro", "vip": True}
    await rig.result(orjson.dumps({**result, "turn": 2, "value": value}))
    await rig.result(orjson.dumps({**result, "call_id": "made/up/1", "turn": 1}))
    letters = rig.on("deadletter")
    assert [x["code"] for x in letters] == ["unexpected_result", "unexpected_result"]
    assert "turn 1" in letters[0]["reason"] and "made/up/1" in letters[1]["reason"]
    st = rig.stores.get(call["instance"])
    assert st is not None and call["call_id"] in st.pending and "customer" not in st.state
    await rig.result(orjson.dumps({**result, "turn": 1, "value": value}))
    st = rig.stores.get(call["instance"])
    assert st is not None and st.state["customer"] == value
    # The same result again (a redelivery) is a repeat, ignored without a dead letter.
    await rig.result(orjson.dumps({**result, "turn": 1, "value": value}))
    assert len(rig.on("deadletter")) == 2 and rig.workflow.results_ignored == 1


async def test_state_input_is_refused_unless_the_spec_opts_in() -> None:
    record = orjson.dumps({"_instance": "t-1", "type": "state", "vip": True})
    rig = Rig(tickets_spec())
    await rig.offer(record)
    await rig.drain()
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "state_input_refused" and "accept_state_input" in letter["reason"]
    assert rig.stores.get("t-1") is None
    assert rig.offsets() == {0: 1}
    opted = tickets_spec().model_copy(update={"accept_state_input": True})
    rig = Rig(opted)
    await rig.offer(record)
    await rig.drain()
    st = rig.stores.get("t-1")
    assert st is not None and st.state["vip"] is True
    assert not rig.on("deadletter")
    # The state is committed with the input's offset: its changelog records are written.
    changed = rig.on("state-changelog")
    assert changed and all(c["instance"] == "t-1" and c["state"]["vip"] for c in changed)


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
