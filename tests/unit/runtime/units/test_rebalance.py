"""The rebalance listener (runtime/units/rebalance.py): a revocation suspends each running
unit (still held), waits a bounded time for its batches in flight and commits its
finished prefix; a member is stable only in a generation it was assigned, and more than
UNSTABLE_PER_MIN rebalances a minute is a storm."""

from __future__ import annotations

import asyncio

from aiokafka.structs import TopicPartition
from instanced_stream.runtime.units.lifecycle import UnitState
from instanced_stream.runtime.units.rebalance import UNSTABLE_PER_MIN, Rebalance
from instanced_stream.runtime.units.unit import Unit

from tests.fakes import UNIT_TOPICS, FakeProducer, fake_unit_manager

TOPICS = UNIT_TOPICS


def _listener() -> tuple[Rebalance, list[FakeProducer]]:
    manager, made = fake_unit_manager()
    return Rebalance("items", manager), made


def _tps() -> set[TopicPartition]:
    return {TopicPartition(t, 0) for t in TOPICS}


async def _opened(listener: Rebalance) -> None:
    tasks = [o.task for o in listener.manager.opening.values() if o.task is not None]
    await asyncio.gather(*tasks)


async def test_a_revocation_commits_the_finished_prefix_and_suspends_the_unit() -> None:
    listener, made = _listener()
    await listener.on_partitions_assigned(_tps())
    await _opened(listener)
    unit = listener.manager.units[0]
    unit.finish(unit.track("items", 0))
    await listener.on_partitions_revoked(_tps())
    assert made[0].committed == {TopicPartition("items", 0): 1}
    assert listener.manager.lifecycle.state(0) is UnitState.SUSPENDED and unit.held
    assert not listener.stable()
    await listener.manager.close_all(commit=False)


async def test_a_member_is_stable_only_in_a_generation_it_was_assigned_and_storms_show() -> None:
    """Readiness's view of the group: before its first assignment and while a rebalance
    is under way a member is not stable; more than UNSTABLE_PER_MIN rebalances in a
    minute is a storm (the livelock of issue 44 kept every member 'ready')."""
    listener, _ = _listener()
    assert not listener.stable()
    assert listener.group()["waiting_for_assignment_s"] is not None
    await listener.on_partitions_assigned(_tps())
    await _opened(listener)
    assert listener.stable() and not listener.group()["storm"]
    for _ in range(UNSTABLE_PER_MIN + 1):
        await listener.on_partitions_revoked(_tps())
        assert not listener.stable()
        await listener.on_partitions_assigned(_tps())
    group = listener.group()
    assert listener.stable() and group["storm"]
    assert group["rebalances_last_min"] == UNSTABLE_PER_MIN + 1
    assert group["waiting_for_assignment_s"] is None
    await listener.manager.close_all(commit=False)


async def test_a_revocation_waits_for_the_batches_in_flight_before_it_commits() -> None:
    """What lands while the revocation waits (`landed`, bounded by `landing_s`) is in its
    commit: the partition's next owner starts after it and asks nothing again (issue 55).
    A stopping member does not wait: its drain gave the batches their time."""
    manager, made = fake_unit_manager()
    waits: list[tuple[list[int], float]] = []

    async def landed(units: list[Unit], deadline_s: float) -> int:
        waits.append(([u.partition for u in units], deadline_s))
        await asyncio.sleep(0.01)
        unit.finish(slot)  # the batch's answer came back and was staged on the unit
        return 0

    listener = Rebalance("items", manager, landed=landed, landing_s=3.0)
    await listener.on_partitions_assigned(_tps())
    await _opened(listener)
    unit = listener.manager.units[0]
    slot = unit.track("items", 0)
    await listener.on_partitions_revoked(_tps())
    assert waits == [([0], 3.0)]
    assert made[0].committed == {TopicPartition("items", 0): 1}
    await listener.manager.close_all(commit=False)
    stopping, _ = fake_unit_manager()
    listener = Rebalance("items", stopping, landed=landed, landing_s=3.0)
    await listener.on_partitions_assigned(_tps())
    await _opened(listener)
    stopping.openings.stopping = True
    await listener.on_partitions_revoked(_tps())
    assert len(waits) == 1
    await listener.manager.close_all(commit=False)
