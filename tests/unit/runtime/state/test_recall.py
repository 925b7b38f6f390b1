"""Read-backs of finished states fail a unit, never the process, and hold nothing else
(runtime/pipeline/workflows.py `recalled`, runtime/units/lanes.py, runtime/state/recall.py,
`Dispatch._read_back`): any error of the broker's client at a read-back is the unit's
failure with back-off; a lane waiting on a slow read-back holds no other partition; a
batch whose instance's workflow finished meanwhile reads its state back instead of being
dead-lettered whole."""

from __future__ import annotations

import asyncio
import time

import orjson
from aiokafka.errors import KafkaConnectionError
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import load_spec
from instanced_stream.core.state import Ended, InstanceState
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.pipeline.workflows import recalled
from instanced_stream.runtime.state.recall import Recall, RecallFailed
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream.runtime.units.fetcher import Fetched
from instanced_stream.runtime.units.lanes import Lanes
from instanced_stream.runtime.units.opening import Failures
from instanced_stream.runtime.units.unit import Unit
from instanced_stream_bench.testing.samples import tickets

from tests.fakes import FakeProducer
from tests.flows import TICKETS, Rig


class _Broken(Recall):
    """A reader whose broker drops the connection."""

    def __init__(self) -> None:
        super().__init__("unused:9092", "changelog")

    async def read(self, partition: int, offset: int, key: str) -> bytes:
        raise KafkaConnectionError("the broker restarted")


def _retired(stores: Stores, partition: int, name: str) -> Unit:
    producer = FakeProducer()
    unit = Unit(partition, producer, group_id="g", transactional=True)
    store = UnitStore("changelog", partition, 1_000_000)
    stores.add(store)
    st = InstanceState(instance=name, partition=partition, status="done")
    st.ended = Ended(status="done", reason="no step left", at=time.time())
    with stores.change() as tx:
        tx.put(st)
    (record,) = tx.records
    store.written(record.key, record.value, 7)  # its record committed at offset 7
    assert store.to_recall(name) == 7  # kept only on the changelog now
    return unit


async def test_a_client_error_at_a_read_back_fails_the_unit_not_the_process() -> None:
    stores = Stores(_Broken())
    unit = _retired(stores, 0, "t-1")
    assert await recalled(stores, unit, "t-1") is False
    assert not unit.held and isinstance(unit.failed, RecallFailed)
    assert "KafkaConnectionError" in str(unit.failed)
    # counted as the broker's: waited out, not five strikes and the process stops
    failures = Failures()
    for _ in range(10):
        failures.failed(0, unit.failed, 0.0)


class _Record:
    def __init__(self, topic: str) -> None:
        self.topic, self.value = topic, b"{}"


async def test_a_lane_waiting_on_a_slow_read_back_holds_no_other_partition() -> None:
    slow, gate = asyncio.Event(), asyncio.Event()
    applied: list[int] = []

    async def apply(got: Fetched) -> None:
        if got.unit.partition == 0:
            slow.set()
            await gate.wait()  # a changelog that takes its time
        if got.unit.partition == 2:
            raise KafkaConnectionError("gone")
        applied.append(got.unit.partition)

    units = {p: Unit(p, FakeProducer(), group_id="g", transactional=True) for p in range(3)}
    lanes = Lanes(apply)
    for unit in units.values():
        lanes.put(Fetched(unit, _Record("results"), unit.track("results", 0)))
    await slow.wait()
    await asyncio.sleep(0.01)
    assert applied == [1]  # partition 1 went on while partition 0 waits
    assert not units[2].held and units[0].held  # an error fails its unit only
    gate.set()
    await asyncio.sleep(0.01)
    assert applied == [1, 0]
    await lanes.stop()


async def test_a_batch_reads_back_a_state_retired_while_it_was_asked() -> None:
    """A unit reopened offered a queued turn again, and that batch ended the workflow
    first: the first batch's answer is played on the state read back, its other items
    untouched (before, NotRecalled failed the whole batch, every item dead-lettered)."""
    rig = Rig(load_spec(TICKETS))
    ticket = tickets(1)[0]
    name = ticket["_instance"]
    await rig.offer(orjson.dumps(ticket))
    await rig.drain()
    state = rig.stores.get(name)
    assert state is not None
    state.status = "done"
    state.ended = Ended(status="done", reason="ended by the other batch", at=time.time())
    with rig.stores.change() as tx:
        tx.put(state)
    unit = rig.unit(0)
    unit.stage(tx.by_partition[0])
    await rig.commit()
    store = rig.stores.by_partition[0]
    assert store.to_recall(name) is not None  # retired: only on the changelog
    inst = Instance(name, ticket, SourcePosition(topic="items", partition=0, offset=0), 1)
    item = Staged(inst, unit, None, b"")
    outcome = Outcome(answers=[Answer(inst, [], "①", 1, 1)])
    kept = await rig.stager.dispatch._read_back([item], outcome)
    assert [a.instance.id for a in kept.answers] == [name]
    assert store.to_recall(name) is None and rig.stores.get(name) is not None
    assert unit.held


async def test_a_batch_leaves_out_only_the_item_whose_read_back_failed() -> None:
    rig = Rig(load_spec(TICKETS), stores=Stores(_Broken()))
    ok_unit = rig.unit(0)
    broken_unit = _retired(rig.stores, 1, "t-gone")
    a = Instance("t-ok", {}, SourcePosition(topic="items", partition=0, offset=0), 1)
    b = Instance("t-gone", {}, SourcePosition(topic="items", partition=1, offset=0), 1)
    outcome = Outcome(answers=[Answer(a, [], "①", 2, 1), Answer(b, [], "②", 2, 1)])
    items = [Staged(a, ok_unit, None, b""), Staged(b, broken_unit, None, b"")]
    kept = await rig.stager.dispatch._read_back(items, outcome)
    assert [x.instance.id for x in kept.answers] == ["t-ok"]
    assert ok_unit.held and not broken_unit.held


class _Slow(Recall):
    """A reader that counts its reads and takes its time."""

    def __init__(self, value: bytes) -> None:
        super().__init__("unused:9092", "changelog")
        self.value, self.count = value, 0

    async def read(self, partition: int, offset: int, key: str) -> bytes:
        self.count += 1
        await asyncio.sleep(0.05)
        return self.value


async def test_two_read_backs_of_one_instance_at_once_share_one_read() -> None:
    """Its repeated result's lane and its new input's intake ask at once."""
    stores = Stores()
    _retired(stores, 0, "t-1")
    (store,) = stores.by_partition.values()
    st = InstanceState(instance="t-1", partition=0, status="done")
    reader = stores.reader = _Slow(st.model_dump_json().encode())
    await asyncio.gather(stores.recall("t-1"), stores.recall("t-1"))
    assert reader.count == 1 and store.to_recall("t-1") is None
