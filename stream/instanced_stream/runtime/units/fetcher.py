"""The fetcher: the first stage of an item's walk (docs/architecture.md, "The walk of one
item"). It reads the group consumer's records and tracks each on a slot of its
partition's running unit, where its outcome will be staged and committed; it holds the
input back under backpressure, and says each partition's lag. Which partitions run is
the lifecycle's (runtime/units/lifecycle.py): the fetcher reads its view of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.structs import TopicPartition

from instanced_stream.kafka.tracing import traceparent_of
from instanced_stream.runtime.units.backlog import held, lag_of
from instanced_stream.runtime.units.lifecycle import Opening
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["MAX_UNCOMMITTED", "Fetched", "Fetcher"]

MAX_UNCOMMITTED = 20_000  # records a unit tracks, not committed, before its input is held


@dataclass(frozen=True, slots=True)
class Fetched:
    """A consumed record, the unit of its partition, and the slot it is tracked on."""

    unit: Unit
    record: ConsumerRecord[bytes, bytes]
    slot: Slot


class Fetcher:
    """Reads `input` and the co-partitioned topics for the `running` units (the
    lifecycle's view); `opening`: the partitions whose unit is being opened (their lag).
    `next`: per partition, the offset it owes next, written by whoever seeks it too."""

    def __init__(
        self,
        input: str,
        running: Mapping[int, Unit],
        opening: Mapping[int, Opening],
        *,
        max_uncommitted: int = MAX_UNCOMMITTED,
    ) -> None:
        self.input, self.running, self.opening = input, running, opening
        self.cap = max_uncommitted
        self.consumer: AIOKafkaConsumer | None = None
        self.next: dict[TopicPartition, int] = {}

    async def fetch(self, timeout_ms: int, max_records: int) -> list[Fetched]:
        """The next records, each tracked on a slot of its partition's unit. A record
        before where its partition was last sought (fetched before the seek) is left out."""
        assert self.consumer is not None
        found = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Fetched] = []
        for tp, records in found.items():
            unit = self.running.get(tp.partition)  # running: held, by the lifecycle's view
            if unit is None:
                continue
            expected = self.next.get(tp, -1)
            for rec in records:
                if rec.offset < expected:
                    continue
                slot = unit.track(tp.topic, rec.offset, traceparent_of(rec.headers))
                out.append(Fetched(unit, rec, slot))
                expected = rec.offset + 1
            self.next[tp] = expected
            # Tracked up to the position: markers and aborted records after the last
            # record are passed too when nothing is open (see Unit.seen).
            unit.seen(tp.topic, await self.consumer.position(tp))
        return out

    def hold_input(self, hold: bool) -> None:
        """Backpressure: while held, fetches leave the input out (results and approvals
        still flow), and the group does not think this member stalled. A unit holding
        `max_uncommitted` records not committed yet has its own input held, not the
        others'. A partition still opening stays paused."""
        assert self.consumer is not None
        paused = self.consumer.paused()
        holding = held(self.input, self.running, hold, self.cap)
        if tps := [tp for tp in holding if tp not in paused]:
            self.consumer.pause(*tps)
        mine = [tp for tp in paused if tp.topic == self.input and tp.partition in self.running]
        if tps := [tp for tp in mine if tp not in holding]:
            self.consumer.resume(*tps)

    async def lag(self) -> dict[int, int]:
        """Per assigned input partition, records not committed yet (see `lag_of`)."""
        assert self.consumer is not None
        return await lag_of(self.consumer, self.input, self.running, self.opening, self.next)
