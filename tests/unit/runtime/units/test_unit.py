"""The unit's commit rules, on an in-memory producer: what a transaction holds, in what
order, and what happens when it cannot commit. The same rules on a real broker:
tests/integration/test_exactly_once.py."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaTimeoutError, ProducerFenced
from aiokafka.structs import TopicPartition
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.state.changes import ChangeOrder, next_change
from instanced_stream.runtime.state.store import UnitStore
from instanced_stream.runtime.units.unit import Slot, Unit, UnitGone, uncommitted

from tests.fakes import FakeProducer

IN, RES = "items", "stream.results"


def _rec(value: bytes) -> OutRecord:
    return OutRecord("activity.x", b"k", value)


def _unit(producer: FakeProducer) -> Unit:
    return Unit(3, producer, group_id="g", transactional=True)


async def test_commits_only_the_finished_contiguous_prefix_in_offset_order() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    slots = [unit.track(IN, offset) for offset in (10, 11, 12)]
    unit.finish(slots[2], [_rec(b"c")])
    unit.finish(slots[0], [_rec(b"a")])
    await unit.commit()
    assert producer.sent() == [b"a"]
    assert producer.offsets() == [{TopicPartition(IN, 3): 11}]
    unit.finish(slots[1], [_rec(b"b")])
    await unit.commit()
    assert producer.sent() == [b"a", b"b", b"c"]  # each instance's outputs in input order
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 13}
    assert [c[0] for c in producer.calls].count("commit") == 2


async def test_each_topic_commits_its_own_prefix_and_free_records_go_with_any() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    held = unit.track(IN, 0)  # an input still with the model
    result = unit.track(RES, 5)
    unit.finish(result, [_rec(b"done")])
    unit.stage([_rec(b"next turn")])
    await unit.commit()
    assert producer.sent() == [b"done", b"next turn"]
    assert producer.offsets() == [{TopicPartition(RES, 3): 6}]
    assert unit.oldest_open(IN) == 0
    unit.finish(held)
    await unit.commit()
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 1}


async def test_commit_passes_markers_when_nothing_is_open() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    unit.finish(unit.track(IN, 7))
    unit.seen(IN, 9)  # offset 8: an upstream transaction's commit marker
    await unit.commit()
    assert producer.offsets() == [{TopicPartition(IN, 3): 9}]
    open_slot = unit.track(IN, 9)
    unit.seen(IN, 11)
    await unit.commit()  # 9 is open: nothing to commit past it
    assert len(producer.offsets()) == 1
    unit.finish(open_slot)
    await unit.commit()
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 11}


async def test_traceparent_of_the_consumed_record_goes_on_its_outputs() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    trace = (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)
    unit.finish(unit.track(IN, 0, trace), [_rec(b"a")])
    await unit.commit()
    assert producer.calls[1][3] == list(trace)


async def test_a_failed_transaction_aborts_and_voids_the_unit() -> None:
    producer = FakeProducer(fail_send=KafkaTimeoutError())
    unit = _unit(producer)
    unit.finish(unit.track(IN, 0), [_rec(b"a")])
    with pytest.raises(KafkaTimeoutError):
        await unit.commit()
    assert ("abort",) in producer.calls and ("commit",) not in producer.calls
    assert not unit.held
    with pytest.raises(UnitGone):
        unit.track(IN, 1)


async def test_a_fenced_unit_is_dropped_without_an_abort() -> None:
    producer = FakeProducer(fail_send=ProducerFenced())
    unit = _unit(producer)
    unit.finish(unit.track(IN, 0), [_rec(b"a")])
    with pytest.raises(ProducerFenced):
        await unit.commit()
    assert not unit.held and ("abort",) not in producer.calls


async def test_at_least_once_commits_offsets_after_the_sends() -> None:
    producer = FakeProducer()
    committed: list[dict[TopicPartition, int]] = []

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        assert producer.sent() == [b"a"]  # acknowledged before the offsets move
        committed.append(offsets)

    unit = Unit(1, producer, group_id="g", transactional=False, commit_offsets=commit)
    unit.finish(unit.track(IN, 4), [_rec(b"a")])
    await unit.commit()
    assert committed == [{TopicPartition(IN, 1): 5}]
    assert not [c for c in producer.calls if c[0] in ("begin", "commit")]


async def test_close_commits_what_is_finished_and_stops_its_producer() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    unit.start()
    unit.finish(unit.track(IN, 0), [_rec(b"a")])
    unit.track(IN, 1)  # unfinished: redone by the next owner
    await unit.close(commit=True)
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 1}
    assert producer.calls[-1] == ("stop",)
    assert not unit.held


async def test_an_empty_value_goes_out_as_a_tombstone() -> None:
    producer = FakeProducer()
    unit = _unit(producer)
    unit.finish(unit.track(IN, 0), [OutRecord("changelog", b"gone", b"", None, 3)])
    await unit.commit()
    assert producer.sent() == [None]  # null: compaction removes the key


@pytest.mark.parametrize(("interval", "transactions"), [(0.01, 2), (0.3, 1)])
async def test_work_finished_within_the_commit_interval_shares_one_transaction(
    interval: float, transactions: int
) -> None:
    """STREAM_COMMIT_INTERVAL: how long a unit waits, once work finished, before it
    commits; what finishes meanwhile goes in the same transaction."""
    producer = FakeProducer()
    unit = Unit(3, producer, group_id="g", transactional=True, linger_s=interval)
    unit.start()
    unit.finish(unit.track(IN, 0), [_rec(b"a")])
    await asyncio.sleep(0.1)
    unit.finish(unit.track(IN, 1), [_rec(b"b")])
    await asyncio.sleep(interval + 0.2)
    assert [c[0] for c in producer.calls].count("commit") == transactions
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 2}
    await unit.close(commit=True)


def _state(turn: int) -> InstanceState:
    return InstanceState(instance="t-1", partition=3, turn=turn)


def _latest(producer: FakeProducer, topic: str) -> dict[bytes, bytes | None]:
    """What compaction keeps of `topic`: each key's last committed value."""
    return {r.key: r.value for r in producer.records if r.topic == topic and r.key is not None}


@pytest.mark.parametrize("order", [(IN, RES), (RES, IN)])
async def test_changelog_records_of_one_transaction_go_in_the_order_they_were_made(
    order: tuple[str, str],
) -> None:
    """Issue 37: the records of one transaction were written slot topic by slot topic and
    the unit's free records last, so an older snapshot of a state could be written after
    a newer one, and compaction would keep the older."""
    producer = FakeProducer()
    unit = _unit(producer)
    store = UnitStore("changelog", 3, 1_000_000)
    first, second = (unit.track(topic, 0) for topic in order)
    unit.stage([store.put(_state(1))])  # a deadline: staged with the next commit
    # then a record of one topic changes it
    unit.finish(first, [_rec(b"out-2"), store.put(_state(2))])
    unit.finish(second, [store.put(_state(3))])  # then one of the other
    await unit.commit()
    assert [c[0] for c in producer.calls].count("commit") == 1  # the precondition
    (kept,) = _latest(producer, "changelog").values()
    assert kept is not None
    assert InstanceState.model_validate_json(kept).turn == 3  # the newest, never an older
    turns = [
        InstanceState.model_validate_json(r.value).turn
        for r in producer.records
        if r.topic == "changelog" and r.value
    ]
    assert turns == [1, 2, 3]
    assert b"out-2" in producer.sent()  # the other records are written as before


async def test_a_change_older_than_one_committed_before_is_not_written_after_it() -> None:
    """An input's admission waits on its slot for its batch; a later change of the same
    state (its earlier turn, applied meanwhile) commits first: the older snapshot, if
    written after it, would be the one compaction keeps."""
    producer = FakeProducer()
    unit = _unit(producer)
    store = UnitStore("changelog", 3, 1_000_000)
    admitted = unit.track(IN, 0)
    admission = [store.put(_state(1))]  # the admission: staged when its batch is done
    unit.stage([store.put(_state(2))])  # the earlier turn, applied and committed first
    await unit.commit()
    unit.finish(admitted, [_rec(b"its outcome"), *admission])
    await unit.commit()
    assert [c[0] for c in producer.calls].count("commit") == 2  # two transactions
    (kept,) = _latest(producer, "changelog").values()
    assert kept is not None and InstanceState.model_validate_json(kept).turn == 2
    assert b"its outcome" in producer.sent()  # the admission's outputs still go out
    assert producer.offsets()[-1] == {TopicPartition(IN, 3): 1}


def _change(key: str) -> OutRecord:
    return OutRecord("changelog", key.encode(), b"{}", None, 3, seq=next_change())


def test_the_change_order_forgets_only_keys_no_change_to_come_can_beat() -> None:
    """Its memory of what was written stays bounded, and never forgets a key an older
    change still to come (one caused by a record not yet committed) could beat."""
    order = ChangeOrder()
    held = Slot(IN, 0)  # consumed now: its change (an admission) is made next
    older = _change("x")
    newer = [_change("x"), *(_change(f"k{i}") for i in range(3000))]
    for at in range(0, len(newer), 100):
        order(newer[at : at + 100], [[held]])
    assert len(order.written) == 3001  # every change is newer than what `held` holds back
    assert order([older], [[held]]) == []  # the older snapshot of x is left out
    # `held` committed: nothing older can come any more. Pruned when it has doubled (the
    # cost of a prune is spread over as many changes as it keeps).
    for i in range(3100):
        order([_change(f"later{i}")], [])
    assert len(order.written) < 3000  # without forgetting: 6102


async def test_uncommitted_counts_consumed_records_until_their_commit() -> None:
    """What /api/live's `units` shows, and what a fault test reads before a kill counts."""
    producer = FakeProducer()
    unit, other = _unit(producer), Unit(5, FakeProducer(), group_id="g", transactional=True)
    slots = [unit.track(IN, offset) for offset in (0, 1, 2)]
    unit.finish(slots[0])
    unit.finish(slots[1])
    assert uncommitted({3: unit, 5: other}) == {"3": 3, "5": 0}
    await unit.commit()
    assert uncommitted({3: unit}) == {"3": 1}  # offset 2 still open
    unit.fail(RuntimeError("gone"))
    assert uncommitted({3: unit}) == {}  # a dropped unit owns nothing


class _Owner:
    """An owner that lets the test say whether it holds the unit."""

    def __init__(self) -> None:
        self.holding = True
        self.told: list[BaseException] = []
        self.closed_units: list[Unit] = []

    def holds(self, unit: Unit) -> bool:
        return self.holding

    def failed(self, unit: Unit, exc: BaseException) -> None:
        self.told.append(exc)
        self.holding = False  # as a lifecycle moves the partition

    def closed(self, unit: Unit) -> None:
        self.closed_units.append(unit)


async def test_whether_a_unit_serves_is_its_owners_answer_not_a_flag_of_its_own() -> None:
    owner = _Owner()
    unit = Unit(3, FakeProducer(), group_id="g", transactional=True, owner=owner)
    slot = unit.track(IN, 0)
    owner.holding = False  # its partition moved on (revoked and closed elsewhere)
    assert not unit.held
    with pytest.raises(UnitGone):
        unit.finish(slot)
    assert await unit.commit() == 0  # nothing is written for a partition not held


async def test_a_failure_is_told_to_the_owner_once_and_at_once() -> None:
    owner = _Owner()
    unit = Unit(
        3, FakeProducer(fail_send=ProducerFenced()), group_id="g", transactional=True, owner=owner
    )
    unit.finish(unit.track(IN, 0), [_rec(b"a")])
    with pytest.raises(ProducerFenced):
        await unit.commit()
    assert len(owner.told) == 1 and isinstance(owner.told[0], ProducerFenced)
    unit.fail(RuntimeError("later"))  # void already: not told again
    assert len(owner.told) == 1
    await unit.close(commit=True)
    assert owner.closed_units == [unit]


class _SlowCommit(FakeProducer):
    """Its transaction's commit takes a while: the window a stop lands in."""

    def __init__(self) -> None:
        super().__init__()
        self.committing = asyncio.Event()

    async def commit_transaction(self) -> None:
        self.committing.set()
        await asyncio.sleep(0.2)
        await super().commit_transaction()


async def test_a_graceful_close_lets_the_commit_under_way_finish() -> None:
    """The stop after a drain: the unit's own commit of what was just delivered is under
    way when the unit is closed with `commit=True`. It finishes (it was cancelled, its
    transaction aborted, and the drained work was redone by the next owner)."""
    producer = _SlowCommit()
    unit = Unit(3, producer, group_id="g", transactional=True, linger_s=0)
    unit.start()
    unit.finish(unit.track(IN, 0), [_rec(b"drained")])
    await producer.committing.wait()
    await unit.close(commit=True)
    assert ("abort",) not in producer.calls
    assert producer.committed == {TopicPartition(IN, 3): 1}
    assert [r.value for r in producer.records] == [b"drained"]
