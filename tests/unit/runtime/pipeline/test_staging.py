"""Staging (runtime/pipeline/staging.py): a solved batch's records onto its items' units,
each item's on its own slot; an item whose unit was dropped stages nothing."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.records import OutRecord
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import Planned, RecordBuilder
from instanced_stream.runtime.pipeline.solved import Solved
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.tier import ONLINE
from instanced_stream.settings import DEFAULT_SPEC, Settings


class _Unit:
    def __init__(self, alive: bool = True) -> None:
        self.held = alive
        self.finished: list[tuple[Any, list[OutRecord]]] = []
        self.staged: list[list[OutRecord]] = []

    def finish(self, slot: Any, records: list[OutRecord]) -> None:
        self.finished.append((slot, records))

    def stage(self, records: list[OutRecord]) -> None:
        self.staged.append(records)


def _item(unit: _Unit, offset: int) -> Any:
    source = SourcePosition(topic="items", partition=0, offset=offset)
    return SimpleNamespace(
        instance=Instance(f"i-{offset}", {"comment": "hi"}, source, 10),
        unit=unit,
        slot=f"slot-{offset}",
        changes=[],
    )


def _staging() -> tuple[Staging, Metrics]:
    settings = Settings()
    spec = load_spec(DEFAULT_SPEC)
    metrics = Metrics()
    builder = RecordBuilder(LiveSpec(spec), settings.topics, "m")
    return Staging(settings, metrics=metrics, builder=builder, tier=ONLINE, flows=None), metrics


def test_each_item_s_records_go_onto_its_own_slot_and_a_dropped_unit_stages_nothing() -> None:
    staging, metrics = _staging()
    kept, dropped = _Unit(), _Unit(alive=False)
    a, b = _item(kept, 1), _item(dropped, 2)
    ra = OutRecord("activity.x", b"k", b"a", origin=("items", 0, 1))
    rb = OutRecord("activity.x", b"k", b"b", origin=("items", 0, 2))
    loose = OutRecord("stream.advice", None, b"batch")
    staging.stage(
        "b-1", [a, b], Solved(Planned(records=[ra, rb, loose], events=Counter(no_action=2)))
    )
    assert kept.finished == [("slot-1", [ra])]
    assert kept.staged == [[loose]]  # about the batch: onto a unit still held
    assert not dropped.finished and not dropped.staged
    assert metrics.counts().get("no_action") == 2, metrics.counts()


def test_a_record_too_large_for_the_broker_is_staged_as_its_item_s_dead_letter() -> None:
    staging, _ = _staging()
    unit = _Unit()
    big = b"x" * (Settings().max_output_bytes + 1)
    record = OutRecord("activity.x", b"k", big, origin=("items", 0, 7))
    staging.stage("b-2", [_item(unit, 7)], Solved(Planned(records=[record])))
    [(slot, records)] = unit.finished
    assert slot == "slot-7" and [r.topic for r in records] == [Settings().topics.dead_letter]
