"""The continuity watch re-reads records the client consumed but no handler saw, and
passes over gaps Kafka itself leaves."""

from __future__ import annotations

import time

from stream.runtime.continuity import Continuity
from stream.runtime.offsets import OffsetLedger, TopicPartition

TP: TopicPartition = ("results", 0)


class Client:
    def __init__(self, position: int, start: int | None = 0) -> None:
        self.pos = self.end = position
        self.first = start
        self.seeks: list[int] = []

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.end

    async def position(self, tp: TopicPartition) -> int | None:
        return self.pos

    async def start(self, tp: TopicPartition) -> int | None:
        return self.first

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)


def _watch(ledger: OffsetLedger, client: Client, idle_s: float = 0.0) -> Continuity:
    return Continuity(
        ledger,
        ["results"],
        client.highwater,
        client.position,
        client.start,
        client.seek,
        idle_s=idle_s,
    )


async def test_records_consumed_but_never_handled_are_read_again() -> None:
    ledger, client = OffsetLedger(), Client(position=4)
    for offset in (0, 1):
        ledger.track(TP, offset, lambda: None)
    watch = _watch(ledger, client)
    await watch.check([TP])
    assert client.seeks == [2] and watch.reread == 2


async def test_nothing_seen_since_assignment_reads_from_where_reading_began() -> None:
    ledger, client = OffsetLedger(), Client(position=6, start=3)
    await _watch(ledger, client).check([TP])
    assert client.seeks == [3]


async def test_a_partition_that_is_caught_up_is_left_alone() -> None:
    ledger, client = OffsetLedger(), Client(position=2)
    for offset in (0, 1):
        ledger.track(TP, offset, lambda: None)
    await _watch(ledger, client).check([TP])
    assert client.seeks == []


async def test_a_busy_handler_is_not_second_guessed() -> None:
    ledger, client = OffsetLedger(), Client(position=9)
    watch = _watch(ledger, client, idle_s=60.0)
    await watch.check([TP])  # idle since it was made, but not for 60 s
    with watch.handling["results"].one():
        watch.handling["results"].since = time.monotonic() - 120
        watch.idle_s = 1.0
        await watch.check([TP])  # at work on a record
    assert client.seeks == []


async def test_a_gap_that_never_fills_is_passed_over_after_a_few_tries() -> None:
    ledger, client = OffsetLedger(), Client(position=5)
    ledger.track(TP, 3, lambda: None)  # offset 4 is a transaction marker: nothing comes
    watch = _watch(ledger, client)
    for _ in range(5):
        await watch.check([TP])
    assert client.seeks == [4, 4, 4]
    assert ledger.seen_next(TP) == 5


async def test_a_quiet_partition_gets_its_baseline_once() -> None:
    ledger, client = OffsetLedger(), Client(position=7, start=7)
    await _watch(ledger, client).check([TP])
    assert client.seeks == [] and ledger.seen_next(TP) == 7
