"""A lazy plan is a checkpoint for human approval (#38 item 3): a rejection with a reason
is planned again, up to the plan's `maxRevisions`, each version kept in the history the
next proposal carries; past the limit (or with none) the rejection ends the workflow."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import ApprovalRecord, BatchRef, SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.state import MemoryStore
from instanced_stream.core.workflow import Workflow

from tests.flows import lazy, tickets_spec, tickets_turn

SRC = SourcePosition(topic="items", partition=0, offset=7)
BATCH = BatchRef(id="b", size=1, token="①", attempt=1)


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
    flow = _revisable(1)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    first = flow.turn(inst, tickets_turn(), BATCH, []).proposal
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
    second = flow.turn(again, tickets_turn(), BATCH, []).proposal
    assert second is not None and second.proposal_id != first.proposal_id
    assert [v["proposal_id"] for v in second.history] == [first.proposal_id]
    assert second.history[0]["steps"] == first.plan
    _, done = _reject(flow, "still no")
    assert done is not None and done.status == "rejected" and done.reason == "still no"


def test_without_max_revisions_a_rejection_ends_the_workflow() -> None:
    flow = _revisable(0)
    inst = flow.admit(Instance("t1", {"subject": "down"}, SRC, 40))
    assert inst is not None
    flow.turn(inst, tickets_turn(), BATCH, [])
    _, done = _reject(flow, "no")
    assert done is not None and done.status == "rejected"
    assert '"rejected" versions' not in PromptBuilder(flow.spec).system
