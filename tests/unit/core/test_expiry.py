"""Finished workflows are deleted after `state_retention_s`, and the expiry
tick reads only the states that are due."""

from __future__ import annotations

import time
from collections.abc import Iterator

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.state import InstanceState
from instanced_stream.core.workflow import Workflow
from instanced_stream.runtime.state.store import Stores

from tests.flows import Rig, tickets_spec

BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)


class CountingStores(Stores):
    """Counts how many states each tick reads (each read is a deep copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, instance: str) -> InstanceState | None:
        self.reads += 1
        return super().get(instance)

    def items(self) -> Iterator[InstanceState]:
        for st in super().items():
            self.reads += 1
            yield st


def _call(tool: str, path: str | None = None) -> Call:
    data = {"_tool": tool, "_instance": "x", "reason": "r", "queue": "standard", "note": "n"}
    if path:
        data["_outputPath"] = path
    return Call.model_validate(data)


def _start(flow: Workflow, name: str, offset: int) -> Instance:
    src = SourcePosition(topic="items", partition=0, offset=offset)
    inst = flow.admit(Instance(name, {"customer": "acme"}, src, 10))
    assert inst is not None
    return inst


async def test_a_finished_workflow_is_deleted_after_its_retention() -> None:
    """No awaited call timed out: the deletion must not depend on one (it did)."""
    rig = Rig(tickets_spec(), retention_s=5)
    rig.unit(0)  # its store
    flow, store = rig.workflow, rig.stores
    done = _start(flow, "t-done", 0)
    turn = flow.turn(done, [("c1", _call("routeTicket"))], BATCH, [])
    assert turn.done is not None  # nothing awaited: the workflow ended
    waiting = _start(flow, "t-waiting", 1)
    flow.turn(waiting, [("c2", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    now = time.time()
    assert await rig.expire(now + 1) == []
    assert await rig.state("t-done") is not None  # still within its retention
    assert store.held()[1] == 1  # kept out of memory: only where its record is
    assert await rig.expire(now + 10) == []
    assert await rig.state("t-done") is None  # forgotten
    assert store.get("t-waiting") is not None  # its call is not due for a minute
    # ... and from its changelog too: a tombstone, committed with the unit's next commit
    assert [r.key for r in rig.records if r.value is None] == [b"t-done"]


async def test_the_expiry_tick_does_not_read_every_state() -> None:
    store = CountingStores()
    rig = Rig(tickets_spec(), stores=store)
    rig.unit(0)  # its store
    flow = rig.workflow
    for i in range(50):
        inst = _start(flow, f"t-{i}", i)
        flow.timeout = 0.5 if i == 7 else 60  # t-7's call falls due in half a second
        flow.turn(inst, [(f"c{i}", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    await rig.expire(time.time())  # the first tick may build its index
    store.reads = 0
    for _ in range(3):
        await rig.expire(time.time())
    assert store.reads == 0  # nothing is due: nothing is read, nothing copied
    # The one that falls due is read (and failed), not the other 49.
    (nxt,) = await rig.expire(time.time() + 1)  # t-7 goes on to its next turn
    assert nxt.id == "t-7" and nxt.turn == 2
    assert 0 < store.reads < 10
    after = store.get("t-7")
    assert after is not None and "timed out" in after.state["errors"]["c7"]
