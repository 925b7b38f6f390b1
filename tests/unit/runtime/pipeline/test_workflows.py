"""Workflows on units (runtime/pipeline/workflows.py): the deadlines' changes are stored
instance by instance, so one that its state cannot hold stops no other."""

from __future__ import annotations

import time

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.state import Write
from instanced_stream.errors import BadRecord
from instanced_stream.runtime.state.store import Stores

from tests.flows import Rig, tickets_spec

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
