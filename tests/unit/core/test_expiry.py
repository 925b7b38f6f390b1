"""Finished workflows are deleted after `state_retention_s`, and the expiry
tick reads only the states that are due."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from instanced_stream.core.expiry import DueIndex, forget_retired
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.state import Ended, InstanceState, MemoryStore, Pending
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


# ---------------------------------------------------------------- the index on its own


def _waiting_on(name: str, partition: int, *deadlines: float) -> InstanceState:
    pending = {
        f"{name}-c{k}": Pending(tool="lookupCustomer", paths=["†state.c"], deadline=d, turn=1)
        for k, d in enumerate(deadlines)
    }
    return InstanceState(instance=name, partition=partition, status="pending", pending=pending)


def _everything(index: DueIndex, now: float) -> list[tuple[str, int]]:
    return index.due(now, lambda _: True)


def test_the_index_hands_out_what_is_due_earliest_first_and_nothing_else() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("late", 0, 30.0))
    index.update(_waiting_on("early", 0, 10.0, 50.0))  # its earliest deadline counts
    index.update(_waiting_on("other", 1, 20.0))
    index.retire("ended", ended_at=-95.0, partition=1)  # due 5: its retention is over
    assert _everything(index, 5.0) == []  # due at 5 is not due before 5
    due = _everything(index, 25.0)
    assert sorted(due) == [("early", 0), ("ended", 1), ("other", 1)]
    assert [name for name, p in due if p == 1] == ["ended", "other"]  # earliest first
    assert _everything(index, 25.0) == []  # handed out once: they left the index
    assert len(index) == 1
    assert _everything(index, 31.0) == [("late", 0)]


def test_a_rescheduled_state_is_due_at_its_new_time_only() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("t-1", 0, 10.0))
    index.update(_waiting_on("t-1", 0, 40.0))  # answered; a later call waits now
    assert _everything(index, 20.0) == []  # the old entry is stale, not handed out
    index.update(_waiting_on("t-1", 0, 15.0))  # and earlier again
    assert _everything(index, 20.0) == [("t-1", 0)]
    assert _everything(index, 50.0) == []  # neither older entry comes back


def test_a_dropped_or_finished_state_leaves_its_old_deadline_behind() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("gone", 0, 10.0))
    index.update(_waiting_on("done", 0, 10.0))
    index.drop("gone", 0)  # deleted
    finished = InstanceState(instance="done", partition=0, status="done")
    finished.ended = Ended(status="done", reason="no step left", at=5.0)
    index.update(finished)  # due at the end of its retention, not at its old deadline
    ready = InstanceState(instance="ready", partition=0, status="ready")
    index.update(_waiting_on("ready", 0, 10.0))
    index.update(ready)  # nothing pending, not finished: nothing to wait for
    assert _everything(index, 50.0) == []
    assert _everything(index, 106.0) == [("done", 0)]
    assert len(index) == 0


def test_a_partition_not_owned_keeps_its_states_until_it_is() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("mine", 0, 10.0))
    index.update(_waiting_on("theirs", 1, 10.0))
    assert index.due(20.0, lambda p: p == 0) == [("mine", 0)]
    assert index.due(20.0, lambda p: p == 0) == []
    assert index.due(20.0, lambda p: True) == [("theirs", 1)]


def test_one_tick_hands_out_at_most_its_share_and_the_next_the_rest() -> None:
    index = DueIndex(retention_s=100)
    for i in range(25):
        index.retire(f"t-{i:02d}", ended_at=float(i), partition=i % 3)
    first = index.due(1000.0, lambda _: True, most=10)
    second = index.due(1000.0, lambda _: True, most=10)
    third = index.due(1000.0, lambda _: True, most=10)
    assert (len(first), len(second), len(third)) == (10, 10, 5)
    assert sorted(first + second + third) == sorted((f"t-{i:02d}", i % 3) for i in range(25))


def test_a_state_rescheduled_over_and_over_is_due_once_at_its_last_time() -> None:
    index = DueIndex(retention_s=100)
    for turn in range(5000):
        index.update(_waiting_on("busy", 0, 1000.0 + turn))
    assert len(index) == 1
    assert _everything(index, 10_000.0) == [("busy", 0)]
    # every entry but the last was stale: none of them is handed out
    assert _everything(index, 10_000.0) == []


async def test_a_reindexed_partition_replaces_its_old_states_and_lets_the_loop_run() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("before-restore", 2, 10.0))  # a state the restore no longer has
    index.update(_waiting_on("elsewhere", 3, 10.0))
    ran = 0

    async def beside() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(beside())
    await asyncio.sleep(0)
    started = ran
    retired = [(f"r-{i}", float(i), 2) for i in range(50)]
    await index.reindex(2, [_waiting_on("live", 2, 10.0)], retired, chunk=10)
    other.cancel()
    assert ran - started >= 4  # it yielded between its chunks of 10
    assert index.built
    due = _everything(index, 1000.0)
    assert ("before-restore", 2) not in due
    assert sorted(due) == sorted(
        [("elsewhere", 3), ("live", 2), *[(f"r-{i}", 2) for i in range(50)]]
    )


def test_a_cleared_partition_is_forgotten_and_only_it() -> None:
    index = DueIndex(retention_s=100)
    index.update(_waiting_on("a", 0, 10.0))
    index.update(_waiting_on("b", 1, 10.0))
    index.clear(0)
    assert _everything(index, 20.0) == [("b", 1)]


class _OneRetired(MemoryStore):
    """A store that keeps `t-1` out of memory, finished at `ended_at`."""

    def __init__(self, ended_at: float) -> None:
        super().__init__()
        self.ended_at = ended_at
        self.deleted: list[tuple[str, int]] = []

    def retired_at(self, instance: str) -> float | None:
        return self.ended_at if instance == "t-1" else None

    def delete(self, instance: str, partition: int) -> None:
        self.deleted.append((instance, partition))


def test_a_retired_state_handed_out_before_its_retention_ends_is_due_again_then() -> None:
    """Indexed by a deadline it had before it finished, it is handed out early: it goes
    back into the index for its end plus the retention, and is deleted only then."""
    index = DueIndex(retention_s=50)
    store = _OneRetired(ended_at=100.0)
    assert forget_retired(store, index, "t-1", 0, 120.0, lambda _: True)
    assert store.deleted == []
    assert _everything(index, 149.0) == []
    assert _everything(index, 151.0) == [("t-1", 0)]
    assert forget_retired(store, index, "t-1", 0, 151.0, lambda _: True)
    assert store.deleted == [("t-1", 0)]
    assert not forget_retired(store, index, "t-2", 0, 151.0, lambda _: True)  # not retired


def test_a_partition_flooded_with_due_states_holds_the_others_back_one_tick_at_most() -> None:
    index = DueIndex(retention_s=100)
    for i in range(100):
        index.retire(f"old-{i:03d}", ended_at=float(i), partition=0)  # a long stop's backlog
    index.update(_waiting_on("deadline", 1, 50.0))
    handed: list[tuple[str, int]] = []
    for _ in range(2):
        handed += index.due(1000.0, lambda _: True, most=10)
    assert ("deadline", 1) in handed  # not after all of partition 0's hundred
