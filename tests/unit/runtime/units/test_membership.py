"""The group's membership on an in-memory consumer and producers: units open one
partition at a time outside the assignment callback, a partition that fails to open
holds no other back and is opened again, `heal` survives a revocation while it waits,
and a stopping member takes no assignment and leaves no producer open
(runtime/units/membership.py, runtime/units/opening.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber
from aiokafka.structs import TopicPartition
from instanced_stream.runtime.units.assignor import Claim
from instanced_stream.runtime.units.lifecycle import (
    IllegalTransition,
    Lifecycle,
    Opening,
    UnitState,
)
from instanced_stream.runtime.units.membership import (
    GroupAddress,
    MemberBounds,
    MemberHooks,
    Membership,
)
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit import Unit, UnitGone

from tests.fakes import FakeConsumer, FakeProducer

TOPICS = ["items", "stream.results", "stream.approvals"]
ADDRESS = GroupAddress("broker:9092", "g", TOPICS)
BOUNDS = MemberBounds(session_timeout_s=6)


def _tps(*partitions: int) -> set[TopicPartition]:
    return {TopicPartition(t, p) for p in partitions for t in TOPICS}


class _Producers:
    """The producer factory: every producer it made, and whether each was stopped."""

    def __init__(self) -> None:
        self.made: list[FakeProducer] = []
        self.gate: asyncio.Event | None = None  # when set: a stop waits for it

    def __call__(self, _bootstrap: str, **_options: Any) -> FakeProducer:
        producer = _Gated(self)
        self.made.append(producer)
        return producer

    def open(self) -> list[FakeProducer]:
        started = [p for p in self.made if ("start",) in p.calls]
        return [p for p in started if ("stop",) not in p.calls]


class _Gated(FakeProducer):
    def __init__(self, owner: _Producers) -> None:
        super().__init__()
        self.owner = owner

    async def stop(self) -> None:
        if self.owner.gate is not None:
            await self.owner.gate.wait()
        await super().stop()


def _membership(
    producers: _Producers, on_open: Any = None, partitions: tuple[int, ...] = (0, 1, 2)
) -> tuple[Membership, FakeConsumer]:
    made = Producers(
        "broker:9092", "g", transactional=True, transactional_prefix="g.items", make=producers
    )
    membership = Membership(ADDRESS, made, BOUNDS, MemberHooks(on_open=on_open))
    consumer = FakeConsumer(_tps(*partitions), {TopicPartition("items", 2): 40})
    membership.consumer = consumer
    return membership, consumer


async def _opened(membership: Membership) -> None:
    """Waits for every open task under way."""
    tasks = [o.task for o in membership.opening.values() if o.task is not None]
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_partition_failing_to_open_holds_no_other_back() -> None:
    broken = {2}

    async def on_open(unit: Unit) -> None:
        if unit.partition in broken:
            raise ValueError("a cut-off state record")

    producers = _Producers()
    membership, consumer = _membership(producers, on_open)
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    assert set(membership.opening) == {0, 1, 2}  # opening, outside the callback
    assert consumer.paused() == _tps(0, 1, 2)  # nothing fetched before its seek
    await _opened(membership)
    assert sorted(membership.units) == [0, 1]
    states = membership.states()
    assert states[2]["state"] == "failing" and "cut-off" in states[2]["error"]
    assert consumer.paused() == _tps(2)
    assert len(producers.open()) == 2  # the failed unit's producer was closed
    assert (await membership.fetcher.lag())[2] == 60  # its backlog shows: end 100, committed 40
    broken.clear()
    membership.opening[2].retry_at = 0.0  # its back-off is over
    await membership.heal()
    await _opened(membership)
    assert sorted(membership.units) == [0, 1, 2] and not membership.opening
    assert consumer.sought[TopicPartition("items", 2)] == 40
    assert not consumer.paused()
    await membership.stop()
    assert not producers.open()


async def test_heal_survives_a_revocation_while_it_waits() -> None:
    producers = _Producers()
    membership, _ = _membership(producers)
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await _opened(membership)
    for unit in membership.units.values():
        unit.fail(RuntimeError("staging bug"))
    producers.gate = asyncio.Event()
    healing = asyncio.create_task(membership.heal())  # waits in a producer's stop
    await asyncio.sleep(0.01)
    revoking = asyncio.create_task(membership.on_partitions_revoked(_tps(0, 1, 2)))
    await asyncio.sleep(0.01)
    producers.gate.set()
    await asyncio.gather(healing, revoking)  # no KeyError
    await membership.on_partitions_assigned(set())  # the rebalance gives them elsewhere
    assert not membership.units and not membership.opening
    assert not producers.open()


def _epoch(membership: Membership, epoch: int) -> None:
    """The assignor's stamp on the assignment about to be taken (on_assignment runs
    before the listener's callback)."""
    membership.strategy[0].claim = Claim(epoch, frozenset())


async def test_a_restore_under_way_survives_a_revocation_that_gives_it_back() -> None:
    """The eager protocol revokes everything at every rebalance: a restore is suspended,
    not restarted, and its partition resumes restoring under the next epoch."""
    restoring, finish = asyncio.Event(), asyncio.Event()
    opened: list[int] = []

    async def on_open(unit: Unit) -> None:
        opened.append(unit.partition)
        restoring.set()
        await finish.wait()  # a long restore

    producers = _Producers()
    membership, consumer = _membership(producers, on_open, partitions=(0,))
    _epoch(membership, 3)
    await membership.on_partitions_assigned(_tps(0))
    await restoring.wait()
    assert membership.states() == {0: {"state": "restoring", "for_s": 0.0, "restored": 0}}
    await membership.on_partitions_revoked(_tps(0))
    assert membership.states() == {0: {"state": "suspended"}}
    assert not membership.opening and not membership.units
    finish.set()  # the restore ends while the partition is revoked: it waits to seek
    await asyncio.sleep(0.01)
    assert not consumer.sought and membership.lifecycle.state(0) is UnitState.SUSPENDED
    _epoch(membership, 4)
    await membership.on_partitions_assigned(_tps(0))
    await _opened(membership)
    assert opened == [0]  # restored once, not again
    assert len(producers.made) == 1 and list(membership.units) == [0]
    assert consumer.sought  # sought once given back
    await membership.stop()
    assert not producers.open()


async def test_a_revocation_while_a_unit_opens_closes_it_when_the_partition_moves() -> None:
    restoring = asyncio.Event()

    async def on_open(unit: Unit) -> None:
        restoring.set()
        await asyncio.Event().wait()  # a long restore

    producers = _Producers()
    membership, _ = _membership(producers, on_open, partitions=(0,))
    await membership.on_partitions_assigned(_tps(0))
    await restoring.wait()
    await membership.on_partitions_revoked(_tps(0))
    await membership.on_partitions_assigned(set())  # given to another member
    assert not membership.opening and not membership.units
    assert not membership.lifecycle.tasks
    assert len(producers.made) == 1 and not producers.open()


async def test_a_suspended_unit_resumes_only_under_the_next_epoch() -> None:
    """Given back under an epoch that is not the next one, another member may have held
    the partition in between: the unit is closed and the partition opened anew."""
    producers = _Producers()
    membership, _ = _membership(producers, partitions=(0,))
    _epoch(membership, 5)
    await membership.on_partitions_assigned(_tps(0))
    await _opened(membership)
    first = membership.units[0]
    await membership.on_partitions_revoked(_tps(0))
    _epoch(membership, 7)  # epoch 6 went by without this member
    await membership.on_partitions_assigned(_tps(0))
    await _opened(membership)
    assert not first.held and membership.units[0] is not first
    assert len(producers.made) == 2 and len(producers.open()) == 1
    await membership.stop()


def test_the_lifecycle_refuses_a_transition_it_does_not_have() -> None:
    lifecycle = Lifecycle()
    lifecycle.move(0, UnitState.ASSIGNED)
    with pytest.raises(IllegalTransition, match="assigned -> running"):
        lifecycle.move(0, UnitState.RUNNING)
    lifecycle.move(0, UnitState.RESTORING)
    lifecycle.move(0, UnitState.CLOSED)
    assert lifecycle.state(0) is None
    with pytest.raises(IllegalTransition, match="not held here"):
        lifecycle.move(0, UnitState.RUNNING)


def test_the_lifecycle_alone_says_whether_a_unit_serves() -> None:
    """Running or suspended, the partition's unit serves; the unit its opening started
    serves while it restores; once the partition moves on (failed, closed), neither."""
    lifecycle = Lifecycle()
    opened, other = (
        Unit(0, FakeProducer(), group_id="g", transactional=True),
        Unit(0, FakeProducer(), group_id="g", transactional=True),
    )
    opening = Opening(0, unit=opened)
    lifecycle.move(0, UnitState.ASSIGNED)
    lifecycle.move(0, UnitState.RESTORING, opening=opening)
    assert lifecycle.holds(opened) and not lifecycle.holds(other)
    lifecycle.move(0, UnitState.RUNNING, unit=opened, opening=None)
    assert lifecycle.holds(opened)
    lifecycle.move(0, UnitState.SUSPENDED)
    assert lifecycle.holds(opened)
    lifecycle.move(0, UnitState.RUNNING)
    lifecycle.move(0, UnitState.FAILED, unit=None, opening=Opening(0))
    assert not lifecycle.holds(opened)
    lifecycle.move(0, UnitState.CLOSED)
    assert not lifecycle.holds(opened)


async def test_a_stopping_member_takes_no_assignment_and_leaves_no_producer_open() -> None:
    producers = _Producers()
    membership, consumer = _membership(producers)
    stopping = asyncio.create_task(membership.stop())
    # The join completes while the member stops: its assignment arrives after the drain.
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await stopping
    await _opened(membership)
    assert consumer.stopped
    assert not membership.units and not membership.opening
    assert not producers.open()


async def test_a_unit_that_fails_leaves_the_running_ones_at_once() -> None:
    """No later look has to find it void: the fetch, the renewal and readiness, which read
    the running units, never see it again once it failed."""
    producers = _Producers()
    membership, consumer = _membership(producers)
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await _opened(membership)
    failed = membership.units[1]
    failed.fail(RuntimeError("bug"))  # no heal in between
    assert 1 not in membership.units and sorted(membership.units) == [0, 2]
    assert membership.states()[1]["state"] == "failing"
    assert TopicPartition("items", 1) in consumer.paused()
    await membership.heal()  # its close finished: its producer stopped
    assert ("stop",) in producers.made[1].calls
    assert len(producers.open()) == 2
    await membership.stop()
    assert not producers.open()


async def test_a_unit_suspended_when_it_fails_is_closed_at_once_and_opened_anew() -> None:
    """Its partition's state moves when it fails, not at the next assignment: suspended,
    it is closed (nothing to reopen until the group says the partition stays); whoever
    stages on it meanwhile is told so."""
    producers = _Producers()
    membership, _ = _membership(producers)
    _epoch(membership, 0)
    await membership.on_partitions_assigned(_tps(0, 1))
    await _opened(membership)
    unit = membership.units[0]
    await membership.on_partitions_revoked(_tps(0, 1))
    assert membership.states()[0]["state"] == "suspended" and unit.held
    unit.fail(RuntimeError("bug"))
    assert 0 not in membership.states() and not unit.held  # closed, at once
    with pytest.raises(UnitGone):
        unit.stage([])
    await membership.heal()  # its close finished: its producer stopped
    assert ("stop",) in producers.made[0].calls
    _epoch(membership, 1)
    await membership.on_partitions_assigned(_tps(0, 1))
    assert membership.states()[0]["state"] == "restoring"  # closed, opened anew
    await _opened(membership)
    assert membership.units[0] is not unit
    await membership.stop()
    assert not producers.open()


@pytest.mark.parametrize("partition", [0, 2])
async def test_a_failed_unit_is_reopened_from_its_last_commit(partition: int) -> None:
    producers = _Producers()
    membership, consumer = _membership(producers)
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await _opened(membership)
    failed = membership.units[partition]
    failed.fail(RuntimeError("bug"))
    await membership.heal()
    assert membership.states()[partition]["state"] == "failing"
    assert TopicPartition("items", partition) in consumer.paused()
    membership.opening[partition].retry_at = 0.0
    await membership.heal()
    await _opened(membership)
    assert membership.units[partition] is not failed and membership.units[partition].held
    await membership.stop()
    assert not producers.open()


async def test_a_revoked_unit_is_suspended_and_resumes_where_it_was() -> None:
    """The eager protocol revokes everything: a unit whose partition comes back keeps its
    producer, its store and what it had in flight; one whose partition moved is closed."""
    producers = _Producers()
    membership, consumer = _membership(producers)
    _epoch(membership, 0)
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await _opened(membership)
    before = dict(membership.units)
    finished, in_flight = before[0].track("items", 0), before[0].track("items", 1)
    before[0].finish(finished)
    items0 = TopicPartition("items", 0)
    membership.fetcher.next[items0] = 2  # two records fetched, as `fetch` tracks them
    await membership.on_partitions_revoked(_tps(0, 1, 2))
    assert before[0].held and producers.made[0].committed == {items0: 1}  # finished: in
    consumer.assigned = _tps(0, 1)
    _epoch(membership, 1)
    await membership.on_partitions_assigned(_tps(0, 1))
    assert membership.units == {0: before[0], 1: before[1]}  # resumed, nothing reopened
    assert len(producers.made) == 3 and not membership.opening
    assert consumer.sought[items0] == 2  # read on after what it had in flight
    assert not before[2].held and len(producers.open()) == 2  # moved away: closed
    before[0].finish(in_flight)
    await before[0].commit()
    assert producers.made[0].committed == {items0: 2}
    await membership.stop()
    assert not producers.open()


async def test_a_unit_over_its_uncommitted_cap_holds_its_own_input_only() -> None:
    producers = _Producers()
    membership, consumer = _membership(producers)
    membership.fetcher.cap = 3
    await membership.on_partitions_assigned(_tps(0, 1, 2))
    await _opened(membership)
    head, *rest = [membership.units[1].track("items", n) for n in range(3)]
    membership.fetcher.hold_input(False)
    assert consumer.paused() == {TopicPartition("items", 1)}  # not the process
    for slot in (head, *rest):
        membership.units[1].finish(slot)
    await membership.units[1].commit()
    membership.fetcher.hold_input(False)
    assert not consumer.paused()
    await membership.stop()


async def test_a_broken_shared_producer_is_renewed_before_its_unit_reopens() -> None:
    """At least once: a refused record leaves the shared idempotent producer with a gap
    in its sequence numbers; every later send fails until a new producer replaces it."""
    producers = _Producers()
    shared = Producers(
        "broker:9092", "g", transactional=False, transactional_prefix="", make=producers
    )
    membership = Membership(ADDRESS, shared, BOUNDS)
    membership.consumer = FakeConsumer(_tps(0), {})
    await shared.start()
    await membership.on_partitions_assigned(_tps(0))
    await _opened(membership)
    membership.units[0].fail(OutOfOrderSequenceNumber())
    await membership.heal()
    membership.opening[0].retry_at = 0.0
    await membership.heal()
    await _opened(membership)
    assert len(producers.made) == 2 and ("stop",) in producers.made[0].calls
    assert membership.units[0].producer is producers.made[1]
    await membership.stop()
    assert not producers.open()


async def test_a_stop_commits_what_each_running_unit_finished() -> None:
    producers = _Producers()
    membership, _ = _membership(producers, partitions=(0,))
    await membership.on_partitions_assigned(_tps(0))
    await _opened(membership)
    unit = membership.units[0]
    unit.finish(unit.track("items", 0))
    await membership.stop()
    assert producers.made[0].committed == {TopicPartition("items", 0): 1}
    assert not producers.open() and not membership.lifecycle.tasks
