"""The turns on their way (runtime/pipeline/queued_turns.py): one turn of an instance at a
time, and a turn queued on a unit dropped since holds nothing back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from instanced_stream.runtime.pipeline.queued_turns import QueuedTurns


def _unit(alive: bool = True) -> Any:
    return SimpleNamespace(held=alive)


def _item(instance: str, unit: Any) -> Any:
    return SimpleNamespace(instance=SimpleNamespace(id=instance), unit=unit)


def test_one_turn_of_an_instance_at_a_time_until_its_batch_is_done() -> None:
    turns, unit = QueuedTurns(), _unit()
    assert turns.add("a", unit)
    assert not turns.add("a", unit)
    turns.done([_item("a", unit)])
    assert turns.add("a", unit)


def test_a_turn_queued_on_a_dropped_unit_holds_nothing_back() -> None:
    turns, old, new = QueuedTurns(), _unit(), _unit()
    assert turns.add("a", old)
    old.held = False
    assert not turns.add("a", _unit(alive=False))  # a dead unit offers nothing
    assert turns.add("a", new)
    turns.done([_item("a", old)])  # the old batch ending leaves the new turn queued
    assert turns.by_instance == {"a": new}
