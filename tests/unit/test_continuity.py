"""The continuity watch re-reads records the client consumed but no handler saw, makes
the client fetch records it left on the broker, and passes over gaps Kafka itself
leaves."""

from __future__ import annotations

import time

import pytest

from instanced_stream.runtime.continuity import Continuity
from instanced_stream.runtime.offsets import OffsetLedger, TopicPartition

TP: TopicPartition = ("results", 0)


class Client:
    def __init__(self, position: int, start: int | None = 0) -> None:
        self.pos = self.end = position
        self.first = start
        self.seeks: list[int] = []
        self.holds: str | None = None
        self.released = 0

    async def ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, self.end)

    async def position(self, tp: TopicPartition) -> int | None:
        return self.pos

    async def starts(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {} if self.first is None else dict.fromkeys(tps, self.first)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)

    def held(self, tp: TopicPartition) -> str | None:
        return self.holds

    def release(self, tp: TopicPartition) -> None:
        self.holds = None
        self.released += 1


def _watch(ledger: OffsetLedger, client: Client, idle_s: float = 0.0) -> Continuity:
    return Continuity(ledger, ["results"], client, idle_s=idle_s)


async def test_records_consumed_but_never_handled_are_read_again() -> None:
    ledger, client = OffsetLedger(), Client(position=4)
    for offset in (0, 1):
        ledger.track(TP, offset, lambda: None)
    watch = _watch(ledger, client)
    await watch.check([TP])  # once may be a record consumed and on its way to the handler
    assert client.seeks == []
    await watch.check([TP])
    assert client.seeks == [2] and watch.reread == 2


async def test_nothing_seen_since_assignment_reads_from_where_reading_began() -> None:
    ledger, client = OffsetLedger(), Client(position=6, start=3)
    watch = _watch(ledger, client)
    await watch.check([TP])
    await watch.check([TP])
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


async def test_a_tail_that_never_fills_is_left_alone_after_a_few_tries() -> None:
    ledger, client = OffsetLedger(), Client(position=5, start=3)
    ledger.finish(ledger.track(TP, 3, lambda: None))  # 4 is a transaction marker
    watch = _watch(ledger, client)
    for _ in range(10):
        await watch.check([TP])
    assert client.seeks == [4, 4, 4]
    assert ledger.commit_point(TP) == 4  # left alone, never committed past


async def test_records_skipped_while_later_ones_were_handled_are_read_again() -> None:
    ledger, client = OffsetLedger(), Client(position=7)
    entries = [ledger.track(TP, offset, lambda: None) for offset in (0, 1, 5, 6)]
    for entry in entries:
        ledger.finish(entry)
    watch = _watch(ledger, client)
    await watch.check([TP])  # once may be records read again on their way
    assert client.seeks == [] and ledger.commit_point(TP) == 2
    await watch.check([TP])
    assert client.seeks == [2] and watch.reread == 3
    for offset in (2, 3, 4, 5, 6):
        ledger.finish(ledger.track(TP, offset, lambda: None))
    assert ledger.gap(TP) is None and ledger.commit_point(TP) == 7


async def test_a_gap_kafka_itself_leaves_closes_on_the_first_record_read_again() -> None:
    ledger, client = OffsetLedger(), Client(position=6)
    for offset in (0, 1, 5):
        ledger.finish(ledger.track(TP, offset, lambda: None))
    watch = _watch(ledger, client)
    await watch.check([TP])
    await watch.check([TP])
    assert client.seeks == [2]
    ledger.finish(ledger.track(TP, 5, lambda: None))  # the broker holds nothing at 2..4
    assert ledger.gap(TP) is None and ledger.commit_point(TP) == 6
    await watch.check([TP])
    assert client.seeks == [2]


async def test_a_gap_sought_once_waits_while_its_handler_is_busy() -> None:
    ledger, client = OffsetLedger(), Client(position=9)
    for offset in (0, 8):
        ledger.track(TP, offset, lambda: None)
    watch = _watch(ledger, client)
    await watch.check([TP])
    await watch.check([TP])
    with watch.handling["results"].one():
        await watch.check([TP])  # backpressure: the re-read is queued, not lost
    assert client.seeks == [1]
    await watch.check([TP])  # idle again and still nothing: sought again
    assert client.seeks == [1, 1] and ledger.commit_point(TP) == 0


async def test_nothing_is_committed_before_where_reading_began_is_known() -> None:
    ledger, client = OffsetLedger(), Client(position=6, start=2)
    ledger.finish(ledger.track(TP, 5, lambda: None))  # 2..4 were dropped before it
    assert ledger.commit_point(TP) is None
    await _watch(ledger, client).check([TP])
    assert ledger.commit_point(TP) == 2 and ledger.gap(TP) == (2, 5)


async def test_a_quiet_partition_gets_its_baseline_once() -> None:
    ledger, client = OffsetLedger(), Client(position=7, start=7)
    await _watch(ledger, client).check([TP])
    assert client.seeks == [] and ledger.seen_next(TP) == 7


async def test_records_left_unfetched_on_two_checks_are_fetched_again() -> None:
    ledger, client = OffsetLedger(), Client(position=2)
    for offset in (0, 1):
        ledger.track(TP, offset, lambda: None)
    client.end, client.holds = 4, "paused by faust"  # 2..3 on the broker, never fetched
    watch = _watch(ledger, client)
    await watch.check([TP])  # once may be a fetch under way
    assert client.seeks == [] and client.released == 0
    await watch.check([TP])
    assert client.seeks == [2] and client.released == 1 and watch.refetched == 1


async def test_records_that_arrive_between_checks_are_not_a_stall() -> None:
    ledger, client = OffsetLedger(), Client(position=2)
    for offset in (0, 1):
        ledger.track(TP, offset, lambda: None)
    client.end = 3
    watch = _watch(ledger, client)
    await watch.check([TP])
    ledger.track(TP, 2, lambda: None)  # the fetch came and was handled
    client.pos, client.end = 3, 5
    await watch.check([TP])  # new records again: a first sighting, not a second
    assert client.seeks == [] and client.released == 0


async def test_a_handler_stuck_on_one_record_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    ledger, client = OffsetLedger(), Client(position=9)
    watch = _watch(ledger, client)
    with watch.handling["results"].one():
        watch.handling["results"].started = time.monotonic() - 120
        await watch.check([TP])
        await watch.check([TP])
    stuck = [r.message for r in caplog.records if "on the same records for 120 s" in r.message]
    assert len(stuck) == 1 and stuck[0].startswith("results: its handler has been")
    assert client.seeks == []
