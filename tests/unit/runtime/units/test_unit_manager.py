"""The units' manager (runtime/units/unit_manager.py): it owns every unit, and a unit's failure
moves its partition's lifecycle at once: running, to FAILED (closed, reopened after a
back-off); the unit is no longer held, whoever stages on it is told so."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import TopicPartition
from instanced_stream.runtime.units.lifecycle import UnitState
from instanced_stream.runtime.units.unit import UnitGone
from instanced_stream.runtime.units.unit_manager import UnitManager

from tests.fakes import UNIT_TOPICS, FakeProducer, fake_unit_manager

TOPICS = UNIT_TOPICS


async def _manager() -> tuple[UnitManager, list[FakeProducer]]:
    manager, made = fake_unit_manager()
    manager.begin([0], epoch=0)
    opening = manager.opening[0]
    assert opening.task is not None
    await asyncio.gather(opening.task)
    return manager, made


async def test_a_running_unit_that_fails_moves_its_partition_at_once() -> None:
    manager, made = await _manager()
    unit = manager.units[0]
    assert manager.lifecycle.state(0) is UnitState.RUNNING and unit.held
    slot = unit.track("items", 0)
    unit.fail(RuntimeError("a bug while staging"))
    assert manager.lifecycle.state(0) is UnitState.FAILED  # no later look needed
    assert not unit.held and 0 not in manager.units
    with pytest.raises(UnitGone):
        unit.finish(slot)
    await manager.closing()
    assert ("stop",) in made[0].calls  # closed without a commit
    assert ("commit",) not in made[0].calls
    await manager.close_all(commit=False)


async def test_close_all_commits_what_a_running_unit_finished_first() -> None:
    manager, made = await _manager()
    unit = manager.units[0]
    unit.finish(unit.track("items", 0))
    await manager.close_all(commit=True)
    assert made[0].committed == {TopicPartition("items", 0): 1}
    assert not manager.lifecycle.tasks and not unit.held
