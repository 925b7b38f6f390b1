"""Workflows on units (runtime/pipeline/workflows.py): the deadlines' changes are stored
instance by instance, so one that its state cannot hold stops no other."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.spec import load_spec
from instanced_stream.core.state import Write
from instanced_stream.errors import BadRecord
from instanced_stream.llm.client import Completion
from instanced_stream.runtime.state.store import Stores

from tests.fakes import FakeLLM
from tests.flows import Rig, tickets_spec

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"

BATCH = BatchRef(id="b-1", size=2, token="①", attempt=1)


def _waiting(rig: Rig, name: str, offset: int, padding: str) -> None:
    """`name`'s workflow waiting for one awaited call, its input padded to `padding`."""
    flow = rig.workflow
    source = SourcePosition(topic="items", partition=0, offset=offset)
    inst = flow.admit(Instance(name, {"customer": "acme", "note": padding}, source, 10))
    assert inst is not None
    call = Call.model_validate(
        {"_tool": "lookupCustomer", "_instance": name, "_outputPath": "†state.customer"}
    )
    flow.turn(inst, [(f"{name}-c1", call)], BATCH, [])


class _Refusing(Stores):
    """Stores whose record limit refuses `t-full`'s state once it is refused (`full`)."""

    full = False

    def encoded(self, write: Write) -> bytes | None:
        if self.full and write.instance == "t-full":
            raise BadRecord("too_large", "the state of t-full would pass the limit")
        return super().encoded(write)


def test_an_expiry_its_state_cannot_hold_stops_no_other() -> None:
    stores = _Refusing()
    rig = Rig(tickets_spec(), stores=stores)
    rig.unit(0)
    _waiting(rig, "t-full", 0, "x" * 400)
    _waiting(rig, "t-small", 1, "")
    assert rig.flows is not None
    stores.full = True
    changes = rig.flows.expire(time.time() + 3600)  # both calls past their deadline
    (effects,) = changes.values()
    assert [r.key for r in effects.changes] == [b"t-small"]  # stored, its record staged
    small, full = rig.stores.get("t-small"), rig.stores.get("t-full")
    assert small is not None and full is not None
    assert "t-small-c1" in small.state["errors"] and not small.pending
    assert "errors" not in full.state and "t-full-c1" in full.pending  # left as it was
    assert [i.id for i in effects.ready] == ["t-small"]  # its next turn, not the other's


class _NoActionOnTurn(FakeLLM):
    """The simulator's answers, but a NoAction for every instance of request `nth` (0 is
    the first): a model that answers none of the due steps of a follow-up turn."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.nth = nth

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], **kw: Any
    ) -> Completion:
        if len(self.requests) == self.nth:
            messages = [{**m, "content": m["content"].replace(COMMENT, MARKED)} for m in messages]
        return await super().complete(messages, response_format, **kw)


COMMENT = "A thoughtful comment on the release notes."
MARKED = COMMENT + " [[sim:noaction]]"


async def test_a_turn_that_answers_no_due_step_makes_the_next_turn() -> None:
    """A lazy plan approved, its follow-up turn answered with NoAction (the assessment still
    due, nothing awaited): the workflow is ready, and the batch's staging hands its next
    turn on, as a result or an approval would. It once waited for a turn nobody offered
    (the seeds' lazy example hung on the real model that way)."""
    llm = _NoActionOnTurn(nth=1)
    rig = Rig(load_spec(EXAMPLES / "seeds" / "lazy.yaml"), llm=llm)
    rig.llm = llm
    await rig.offer(orjson.dumps({"_instance": "c-1", "comment": COMMENT}))
    await rig.drain()
    (proposal,) = rig.on("proposals")
    approval = {"instance": "c-1", "proposal_id": proposal["proposal_id"], "turn": 1}
    await rig.approval(orjson.dumps({**approval, "approve": True}))
    await rig.drain()  # the follow-up turn: NoAction
    assert len(llm.requests) == 2
    st = await rig.state("c-1")
    assert st is not None and st.status == "ready" and st.turn == 2, st
    assert [(inst.id, inst.turn) for _, inst in rig.ready] == [("c-1", 3)]
    await rig.turns(rig.ready)
    await rig.drain()  # turn 3: the simulator answers the assessment this time
    assert len(llm.requests) == 3
    st = await rig.state("c-1")
    assert st is not None and "assessment" in st.state, st
