"""Issue 37: a finished workflow's state leaves memory when it ends. Once its changelog
record is committed the store keeps only that record's offset and when the workflow
ended; a repeated answer or a new input of the instance reads it back first. The same on
a real broker, with the memory it takes: tests/integration/test_store_delta.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiokafka.structs import TopicPartition
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, SourcePosition
from instanced_stream.core.state import Ended, InstanceState
from instanced_stream.kafka import clients
from instanced_stream.runtime.pipeline.restore import Restores
from instanced_stream.runtime.state.changelog import AT_ONCE
from instanced_stream.runtime.state.store import NotRecalled, Stores, UnitStore
from instanced_stream.runtime.units.unit import Unit

from tests.fakes import FakeProducer, FakeRecall
from tests.flows import Rig, tickets_spec

BATCH = BatchRef(id="b-1", size=1, token="①", attempt=1)
SRC = SourcePosition(topic="items", partition=0, offset=0)
ENDED = time.time()
GOLD = {"plan": "gold", "vip": True}


def _finished(name: str, turn: int = 2) -> InstanceState:
    st = InstanceState(instance=name, partition=3, turn=turn, status="done")
    st.ended = Ended(status="done", reason="no step left", at=ENDED)
    st.state = {"customer": {"tier": "gold"}, "notes": "x" * 500}
    return st


def _wired() -> tuple[FakeProducer, Unit, Stores, UnitStore]:
    producer = FakeProducer()
    unit = Unit(3, producer, group_id="g", transactional=True)
    stores = Stores(FakeRecall(producer))
    store = UnitStore("changelog", 3, 1_000_000)
    stores.add(store)
    unit.written = stores.written
    return producer, unit, stores, store


async def test_a_finished_state_leaves_memory_once_its_record_is_committed() -> None:
    producer, unit, stores, store = _wired()
    with stores.change() as tx:
        tx.put(_finished("t-1"))
        tx.put(InstanceState(instance="t-2", partition=3, status="pending"))
    assert stores.held() == (2, 0, 0)  # its record is not written yet: still here
    unit.stage(tx.records)
    await unit.commit()
    assert stores.held() == (1, 1, 0)  # t-1 retired; t-2 still works
    assert "t-1" in store and stores.partition_of("t-1") == 3
    assert [st.instance for st in stores.items()] == ["t-2"]  # a scan does not read it
    assert list(stores.retired()) == [("t-1", ENDED, 3)]
    with pytest.raises(NotRecalled):  # a read without its read-back is a bug, loudly
        stores.get("t-1")
    await stores.recall("t-1")
    assert stores.get("t-1") == _finished("t-1")
    assert stores.held() == (1, 1, 1)  # one read back, still retired
    assert [c[0] for c in producer.calls].count("commit") == 1


async def test_a_state_changed_again_before_the_commit_is_not_retired_by_its_older_record() -> None:
    _, unit, stores, _store = _wired()
    with stores.change() as tx:
        tx.put(_finished("t-1"))
    unit.stage(tx.records)
    again = _finished("t-1").model_copy(update={"status": "new", "ended": None})
    with stores.change() as tx:
        tx.put(again)  # a new input restarted it while the commit was being made
    await unit.commit()  # writes the finished record only
    assert stores.held() == (1, 0, 0)
    assert stores.get("t-1") == again


async def test_a_retired_state_is_deleted_and_undone_without_being_read() -> None:
    _, unit, stores, store = _wired()
    with stores.change() as tx:
        tx.put(_finished("t-1"))
    unit.stage(tx.records)
    await unit.commit()
    with stores.change() as tx:
        tx.delete("t-1", 3)
    (tombstone,) = tx.records
    assert tombstone.key == b"t-1" and tombstone.value == b""
    assert "t-1" not in store and stores.held() == (0, 0, 0)
    assert stores.reader is not None and stores.reader.reads == 0


async def test_finished_workflows_retire_and_are_read_back_by_a_repeat_and_a_new_input() -> None:
    """Through the workflow, as the processor runs it: the turn that ends it commits its
    state; the same result again is a repeat (read back to know it); a new input of the
    instance restarts it on its earlier state, read back."""
    rig = Rig(tickets_spec())
    rig.unit(0)
    flow = rig.workflow
    inst = flow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert inst is not None
    call = Call.model_validate(
        {"_tool": "lookupCustomer", "_instance": "t-1", "_outputPath": "†state.customer"}
    )
    flow.turn(inst, [("c1", call)], BATCH, [])
    await rig.commit()
    result = orjson.dumps(
        {"call_id": "c1", "instance": "t-1", "tool": "lookupCustomer", "turn": 1, "value": GOLD}
    )
    spec = tickets_spec()
    assert spec.plan is not None and spec.plan.max_turns >= 2
    rig.live.install(
        spec.model_copy(update={"plan": spec.plan.model_copy(update={"max_turns": 1})})
    )
    await rig.result(result)  # the turn limit: it ends
    assert rig.stores.held()[:2] == (0, 1)  # retired: out of memory
    await rig.result(result)  # the same result again
    assert rig.metrics.counts().get("answers_repeated") == 1
    assert rig.on("deadletter") == []
    assert rig.stores.held()[2] == 1  # read back to tell it was answered
    await rig.stores.recall("t-1")
    restarted = flow.admit(Instance("t-1", {"customer": "acme"}, SRC, 10))
    assert restarted is None  # the very input that started it: redelivered, not redone
    again = flow.admit(
        Instance("t-1", {"customer": "acme"}, SRC.model_copy(update={"offset": 9}), 10)
    )
    assert again is not None and again.state == {"customer": GOLD}  # its earlier state


class _Changelog:
    """The consumer a restore reads a changelog partition with, in memory: `sizes` records
    per partition, handed out 500 at a time with a round trip's wait; counts the large
    reads under way."""

    def __init__(self, sizes: dict[int, int], reading: list[int]) -> None:
        self.sizes, self.reading, self.at = sizes, reading, 0
        self.tp = TopicPartition("changelog", 0)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self.tp.partition in self.reading:
            self.reading.remove(self.tp.partition)

    def assign(self, tps: list[TopicPartition]) -> None:
        (self.tp,) = tps

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {self.tp: 0}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {self.tp: self.sizes[self.tp.partition]}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.at = offset

    async def position(self, tp: TopicPartition) -> int:
        return self.at

    async def getmany(self, tp: TopicPartition, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        if self.sizes[tp.partition] > 2000 and tp.partition not in self.reading:
            self.reading.append(tp.partition)
        await asyncio.sleep(0.005)
        n = min(500, self.sizes[tp.partition] - self.at)
        records = [_Record(f"t-{tp.partition}-{self.at + k}", self.at + k) for k in range(n)]
        self.at += n
        return {tp: records}


@dataclass
class _Record:
    name: str
    offset: int

    @property
    def key(self) -> bytes:
        return self.name.encode()

    @property
    def value(self) -> bytes:
        st = InstanceState(instance=self.name, partition=0, status="pending")
        return st.model_dump_json().encode()


async def test_large_restores_read_a_few_at_a_time_and_small_ones_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore holds its partition's records until it has parsed them: 24 large ones at
    once held every partition's records together (the churn run's 444 MB peak). A small
    one (a fresh partition, a delta) is round trips, not parsing: it never waits."""
    sizes = {p: (3000 if p < 12 else 10) for p in range(24)}
    reading: list[int] = []
    most = 0
    opened: dict[int, float] = {}

    def consumer(bootstrap: str) -> _Changelog:
        return _Changelog(sizes, reading)

    monkeypatch.setattr(clients, "consumer", consumer)
    rig = Rig(tickets_spec())
    assert rig.flows is not None
    restores = Restores(rig.flows, "unused:9092")
    started = time.monotonic()

    async def restore(p: int) -> None:
        await restores.restore(rig.unit(p))
        opened[p] = time.monotonic() - started

    async def peak() -> None:
        nonlocal most
        while True:
            most = max(most, len(reading))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(peak())
    await asyncio.gather(*(restore(p) for p in range(24)))
    watcher.cancel()
    assert most == AT_ONCE  # large reads: never more at once
    assert sorted(len(rig.stores.by_partition[p]) for p in range(24)) == [10] * 12 + [3000] * 12
    slowest_small = max(opened[p] for p in range(12, 24))
    assert slowest_small < sorted(opened[p] for p in range(12))[AT_ONCE - 1]  # none waited
