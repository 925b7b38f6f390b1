"""The record collector of a unit (runtime/units/collector.py): it sends records and
returns their offsets, replaces a record the broker refuses for itself with its item's
dead letter, renews the producer the refusal broke, and raises what it cannot change."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.units.collector import RecordCollector, Refusals, Refused

from tests.fakes import FakeProducer


def _record(topic: str, size: int) -> OutRecord:
    return OutRecord(topic, b"k", b"x" * size, None, 0)


def _letter(rec: OutRecord, why: str) -> list[OutRecord]:
    return [OutRecord("deadletter", rec.key, why.encode(), None, 0)]


def _collector(producer: FakeProducer, refusals: Refusals | None = None) -> RecordCollector:
    return RecordCollector(0, cast(Any, producer), refusals)


async def test_records_are_sent_in_order_and_their_offsets_returned() -> None:
    producer = FakeProducer()
    collector = _collector(producer)
    assert await collector.send([_record("a", 1), _record("b", 2)]) == [0, 1]
    assert [s.topic for s in producer.records] == ["a", "b"]
    assert await collector.send([]) == []


async def test_a_refused_record_is_replaced_by_its_dead_letter_and_the_producer_renewed() -> None:
    broken = FakeProducer(limits={"big": 1000})
    fresh = FakeProducer()
    renewals: list[int] = []

    async def limits(topics: set[str]) -> dict[str, int]:
        return dict.fromkeys(topics, 1000)

    async def renew(old: Any, max_batch: int) -> Any:
        assert old is broken
        renewals.append(max_batch)
        return fresh

    collector = _collector(broken, Refusals(_letter, limits, renew))
    records = [_record("small", 10), _record("big", 5000)]
    with pytest.raises(Refused) as refused:
        await collector.send(records)
    assert list(refused.value.refused) == [1]
    out = await collector.replaced(records, refused.value)
    assert [r.topic for r in out] == ["small", "deadletter"]
    assert b"max.message.bytes 1000" in out[1].value
    assert collector.producer is fresh and renewals == [1000 - 128]


async def test_a_refusal_nothing_can_change_is_raised_as_the_broker_said_it() -> None:
    producer = FakeProducer(limits={"big": 1000})
    collector = _collector(producer)  # no refusals policy: nothing is replaced
    records = [_record("big", 5000)]
    with pytest.raises(Refused) as refused:
        await collector.send(records)
    with pytest.raises(MessageSizeTooLargeError):
        await collector.replaced(records, refused.value)
    assert collector.producer is cast(Any, producer)


def test_a_renewed_shared_producer_replaces_only_the_broken_one() -> None:
    broken, fresh, other = FakeProducer(), FakeProducer(), FakeProducer()
    on_broken, on_other = _collector(broken), _collector(other)
    for collector in (on_broken, on_other):
        collector.renewed(cast(Any, broken), cast(Any, fresh))
    assert on_broken.producer is cast(Any, fresh)
    assert on_other.producer is cast(Any, other)
