"""The fetcher (runtime/units/fetcher.py): each record fetched is tracked on a slot of its
partition's running unit; a partition not running here hands out nothing; a record
before where its partition was sought is left out."""

from __future__ import annotations

from aiokafka.structs import TopicPartition
from instanced_stream.runtime.units.fetcher import Fetcher
from instanced_stream.runtime.units.unit import Unit

from tests.fakes import FakeConsumer, FakeProducer

IN = "items"


def _fetcher(*running: int) -> tuple[Fetcher, FakeConsumer, dict[int, Unit]]:
    units = {p: Unit(p, FakeProducer(), group_id="g", transactional=True) for p in running}
    fetcher = Fetcher(IN, units, {})
    consumer = FakeConsumer({TopicPartition(IN, p) for p in (0, 1)}, {})
    fetcher.consumer = consumer
    return fetcher, consumer, units


async def test_each_record_is_tracked_on_its_running_unit() -> None:
    fetcher, consumer, units = _fetcher(0)
    consumer.put(TopicPartition(IN, 0), b"a")
    consumer.put(TopicPartition(IN, 0), b"b")
    consumer.put(TopicPartition(IN, 1), b"elsewhere")  # not running here
    got = await fetcher.fetch(0, 10)
    assert [g.record.value for g in got] == [b"a", b"b"]
    assert all(g.unit is units[0] for g in got)
    assert [g.slot.offset for g in got] == [0, 1] and units[0].open_slots() == 2
    assert fetcher.next[TopicPartition(IN, 0)] == 2


async def test_a_record_before_the_sought_offset_is_left_out() -> None:
    fetcher, consumer, units = _fetcher(0)
    tp = TopicPartition(IN, 0)
    consumer.put(tp, b"old")
    consumer.put(tp, b"new")
    fetcher.next[tp] = 1  # sought past the first while it was on its way
    got = await fetcher.fetch(0, 10)
    assert [g.record.value for g in got] == [b"new"] and units[0].open_slots() == 1
