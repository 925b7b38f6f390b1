"""#24 item 3: finished workflows are deleted after `state_retention_s`, and the expiry
tick reads only the states that are due."""

from __future__ import annotations

import time
from collections.abc import Iterator

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.state import InstanceState, MemoryStore
from tests.flows import pipeline, tickets_spec

BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)


class CountingStore(MemoryStore):
    """Counts how many states each tick reads (each read is a deep copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, instance: str) -> InstanceState | None:
        self.reads += 1
        return super().get(instance)

    def items(self) -> Iterator[InstanceState]:
        self.reads += len(self.data)
        return super().items()


def _call(tool: str, path: str | None = None) -> Call:
    data = {"_tool": tool, "_instance": "x", "reason": "r", "queue": "standard", "note": "n"}
    if path:
        data["_outputPath"] = path
    return Call.model_validate(data)


def _start(pipe_flow: object, name: str, offset: int) -> Instance:
    from instanced_stream.core.workflow import Workflow

    assert isinstance(pipe_flow, Workflow)
    src = SourcePosition(topic="items", partition=0, offset=offset)
    inst = pipe_flow.admit(Instance(name, {"customer": "acme"}, src, 10))
    assert inst is not None
    return inst


async def test_a_finished_workflow_is_deleted_after_its_retention() -> None:
    """No awaited call timed out: the deletion must not depend on one (it did)."""
    pipe, _, store = pipeline(tickets_spec(), retention_s=5)
    flow = pipe.workflow
    assert flow is not None
    done = _start(flow, "t-done", 0)
    turn = flow.turn(done, [("c1", _call("routeTicket"))], BATCH, [])
    assert turn.done is not None  # nothing awaited: the workflow ended
    waiting = _start(flow, "t-waiting", 1)
    flow.turn(waiting, [("c2", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    now = time.time()
    assert await pipe.coordinator.expire(now + 1) == []
    assert store.get("t-done") is not None  # still within its retention
    assert await pipe.coordinator.expire(now + 10) == []
    assert store.get("t-done") is None  # forgotten
    assert store.get("t-waiting") is not None  # its call is not due for a minute


async def test_the_expiry_tick_does_not_read_every_state() -> None:
    store = CountingStore()
    pipe, _, _ = pipeline(tickets_spec(), store)
    flow = pipe.workflow
    assert flow is not None
    for i in range(50):
        inst = _start(flow, f"t-{i}", i)
        flow.timeout = 0.5 if i == 7 else 60  # t-7's call falls due in half a second
        flow.turn(inst, [(f"c{i}", _call("lookupCustomer", "†state.customer"))], BATCH, [])
    await pipe.coordinator.expire(time.time())  # the first tick may build its index
    store.reads = 0
    for _ in range(3):
        await pipe.coordinator.expire(time.time())
    assert store.reads == 0  # nothing is due: nothing is read, nothing copied
    # The one that falls due is read (and failed), not the other 49.
    assert await pipe.coordinator.expire(time.time() + 1)  # t-7 goes on to its next turn
    assert 0 < store.reads < 10
    after = store.get("t-7")
    assert after is not None and "timed out" in after.state["errors"]["c7"]
