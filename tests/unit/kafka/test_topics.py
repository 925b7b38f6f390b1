"""Topics are created in requests the broker accepts: a KRaft controller refuses one that
creates too many partitions at once ("Excessively large number of partitions per
request", measured: eleven topics of 1,024 partitions in one request), whole.

TopicReader reads many topics over one admin client and one consumer
(a pair of clients per audit, not per topic read: audits are polled), asks the broker for
its topic metadata once, and never starts a consumer just to list partitions. On fake
clients; tests/integration's audits read a real broker through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition
from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import (
    PARTITIONS_PER_REQUEST,
    TopicReader,
    partitions,
    read_topic,
    topic_batches,
)


def test_large_topics_go_in_several_requests_none_over_the_limit() -> None:
    names = [f"t{i}" for i in range(12)]
    batches = topic_batches(names, 1024)
    assert [n for b in batches for n in b] == names  # every topic, once, in order
    assert len(batches) > 1
    assert all(len(b) * 1024 <= PARTITIONS_PER_REQUEST for b in batches)
    # small topics stay in one request; a topic larger than the limit goes alone
    assert topic_batches(names, 4) == [names]
    assert topic_batches(["huge", "other"], 20_000) == [["huge"], ["other"]]
    assert topic_batches([], 1024) == []


@dataclass
class _Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass
class _Found:
    offset: int


class _FakeAdmin:
    """The broker's metadata: topic -> partition count, shared with the test so it can
    create a topic while a reader holds its copy."""

    def __init__(self, partition_counts: dict[str, int]) -> None:
        self.partition_counts = partition_counts
        self.starts = self.closes = self.metadata_requests = 0

    async def start(self) -> None:
        self.starts += 1

    async def close(self) -> None:
        self.closes += 1

    async def describe_topics(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        assert topics is None, "a missing topic asked for by name would be auto-created"
        self.metadata_requests += 1
        return [
            {"topic": t, "error_code": 0, "partitions": [{"partition": p} for p in range(n)]}
            for t, n in self.partition_counts.items()
        ]


class _FakeConsumer:
    """Partitions' records in memory, timestamps 10 apart (offset * 10); a fetch hands at
    most two records per partition, so a read takes several."""

    def __init__(self, records: dict[TopicPartition, int]) -> None:
        self.records = records  # partition -> how many records it holds
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.starts = self.stops = 0

    async def start(self) -> None:
        self.starts += 1

    async def stop(self) -> None:
        self.stops += 1

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned, self.positions = set(tps), {}

    def _held(self, tp: TopicPartition) -> None:
        assert tp in self.assigned, f"{tp} is not assigned"

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._held(tp)
            self.positions[tp] = 0

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._held(tp)
        self.positions[tp] = offset

    async def position(self, tp: TopicPartition) -> int:
        self._held(tp)
        return self.positions[tp]

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.records.get(tp, 0) for tp in tps}

    async def offsets_for_times(
        self, times: dict[TopicPartition, int]
    ) -> dict[TopicPartition, _Found | None]:
        return {
            tp: _Found(-(-ms // 10)) if ms <= (self.records.get(tp, 0) - 1) * 10 else None
            for tp, ms in times.items()
        }

    async def getmany(self, *tps: TopicPartition, timeout_ms: int) -> dict[TopicPartition, Any]:
        batch: dict[TopicPartition, list[_Rec]] = {}
        for tp in tps:
            self._held(tp)
            at, end = self.positions[tp], self.records.get(tp, 0)
            fetched = [_Rec(tp.topic, tp.partition, o, o * 10) for o in range(at, min(at + 2, end))]
            self.positions[tp] = at + len(fetched)
            if fetched:
                batch[tp] = fetched
        return batch


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> tuple[list[_FakeAdmin], list[_FakeConsumer]]:
    """Topic `a` (two partitions of 3 and 5 records), `b` (one of 4) and `empty`; every
    admin client and consumer made from now on, in order."""
    counts = {"a": 2, "b": 1, "empty": 1}
    records = {TopicPartition("a", 0): 3, TopicPartition("a", 1): 5, TopicPartition("b", 0): 4}
    admins: list[_FakeAdmin] = []
    consumers: list[_FakeConsumer] = []

    def admin(bootstrap: str, **options: Any) -> _FakeAdmin:
        admins.append(_FakeAdmin(counts))
        return admins[-1]

    def consumer(bootstrap: str, *topics: str, **options: Any) -> _FakeConsumer:
        consumers.append(_FakeConsumer(records))
        return consumers[-1]

    monkeypatch.setattr(clients, "admin", admin)
    monkeypatch.setattr(clients, "consumer", consumer)
    return admins, consumers


def _positions(records: list[Any]) -> list[tuple[str, int, int]]:
    return sorted((r.topic, r.partition, r.offset) for r in records)


async def test_many_reads_share_one_admin_client_and_one_consumer(
    broker: tuple[list[_FakeAdmin], list[_FakeConsumer]],
) -> None:
    admins, consumers = broker
    async with TopicReader("b:9092") as reader:
        whole = [r async for r in reader.read("a")]
        recent = [r async for r in reader.read("a", since_offset=3)]
        by_time = [r async for r in reader.read("b", since_ms=15)]
        assert [r async for r in reader.read("empty")] == []
        assert [r async for r in reader.read("missing")] == []
        assert await reader.partitions("a") == [0, 1]
    assert len(whole) == 8
    assert _positions(recent) == [("a", 1, 3), ("a", 1, 4)]
    assert _positions(by_time) == [("b", 0, 2), ("b", 0, 3)]
    [admin], [consumer] = admins, consumers
    assert (admin.starts, admin.closes, consumer.starts, consumer.stops) == (1, 1, 1, 1)
    # Once for the topics it knew, once more for the one it did not find.
    assert admin.metadata_requests == 2


async def test_partitions_start_no_consumer_and_a_missing_topic_is_asked_again(
    broker: tuple[list[_FakeAdmin], list[_FakeConsumer]],
) -> None:
    admins, consumers = broker
    async with TopicReader("b:9092") as reader:
        assert await reader.partitions("later") == []
        admins[0].partition_counts["later"] = 3  # created meanwhile
        assert await reader.partitions("later") == [0, 1, 2]
        assert await reader.partitions("a") == [0, 1]  # from the copy it holds
    assert consumers == [] and admins[0].metadata_requests == 2
    assert admins[0].closes == 1
    async with TopicReader("b:9092"):
        pass
    assert len(admins) == 1, "a reader that read nothing starts no client"


async def test_a_read_started_before_the_last_one_finished_fails_the_last_one(
    broker: tuple[list[_FakeAdmin], list[_FakeConsumer]],
) -> None:
    async with TopicReader("b:9092") as reader:
        first = reader.read("a")
        await anext(first)
        assert len([r async for r in reader.read("b")]) == 4  # took the consumer
        with pytest.raises(StreamError, match="took its consumer"):
            async for _ in first:
                pass


async def test_the_module_functions_use_a_reader_of_their_own(
    broker: tuple[list[_FakeAdmin], list[_FakeConsumer]],
) -> None:
    admins, consumers = broker
    assert await partitions("b:9092", "a") == [0, 1]
    assert len([r async for r in read_topic("b:9092", "b", None, 2)]) == 2
    assert [(a.starts, a.closes) for a in admins] == [(1, 1), (1, 1)]
    assert [(c.starts, c.stops) for c in consumers] == [(1, 1)]
