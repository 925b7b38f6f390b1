"""Membership: the processor's place in its consumer group, and the units it owns.

One aiokafka consumer (read_committed, no auto commit, the sticky co-partitioned assignor
of runtime/engine/assignor.py, so partition p of the input, results and approvals topics
goes to one member and stays there while the group's size does) subscribes to the three
co-partitioned topics. An assignment opens a unit per input partition: its producer is
started first (with exactly once, that fences the partition's earlier owner and settles
its open transaction), then the consumer is sought to the committed offsets, read only
now that no earlier transaction can still move them. A revocation commits each unit's
finished prefix and drops it; a unit that failed (fenced, a failed transaction) is
replaced in place, and everything staged on it is redone from the last commit.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from instanced_stream.errors import StreamError
from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import record_limits
from instanced_stream.kafka.tracing import traceparent_of
from instanced_stream.runtime.engine.assignor import CoPartitionedAssignor
from instanced_stream.runtime.engine.unit import LINGER_S, Refusals, Replace, Slot, Unit

__all__ = [
    "MAX_FAILURES",
    "Failures",
    "Fetched",
    "Membership",
    "PartitionFailing",
    "SharedProducer",
]

log = logging.getLogger("stream.membership")

OnOpen = Callable[[Unit], Awaitable[None]]

MAX_FAILURES = 5  # a partition's failures in a row before the process stops


class PartitionFailing(StreamError):
    """A partition's unit kept failing: its work cannot be delivered by this process."""


class Failures:
    """When a failed unit may be reopened: after a back-off that doubles with each
    failure in a row (up to 10 s). The broker's own errors (unreachable, timed out,
    fenced) are waited out for as long as they last; any other failure counts, and a
    partition that fails `MAX_FAILURES` times in a row without a commit between stops the
    process (`PartitionFailing`): its prefix cannot be delivered here, and a restart (or
    another member) is the remedy an operator sees, rather than a silent loop that asks
    the model again and again."""

    def __init__(self) -> None:
        self.by_partition: dict[int, tuple[int, float]] = {}  # (failures, retry at)

    def due(self, p: int, unit: Unit, now: float) -> bool:
        """Whether `unit` of partition `p` is to be reopened now."""
        if unit.alive:
            if unit.commits:
                self.by_partition.pop(p, None)
            return False
        count, retry_at = self.by_partition.get(p, (0, 0.0))
        if retry_at == 0.0:  # just failed: count it, and wait before reopening
            tries = count + 1
            if not isinstance(unit.failed, KafkaError):
                count += 1
                if count >= MAX_FAILURES:
                    raise PartitionFailing(
                        f"partition {p} failed {count} times in a row: {unit.failed!r}"
                    )
            self.by_partition[p] = (count, now + min(0.5 * 2 ** min(tries - 1, 5), 10.0))
            return False
        if now < retry_at:
            return False
        self.by_partition[p] = (count, 0.0)
        return True


class SharedProducer:
    """At least once: the one idempotent producer every unit writes with. A record the
    broker refuses leaves a gap in its sequence numbers for the record's partition
    (aiokafka never takes back a refused batch's numbers), and every later send there
    would fail with OutOfOrderSequenceNumber, from every unit: `renew` replaces it on every
    unit with a new producer (a new producer id, numbered from zero). `make`: a started
    producer, given the largest record batch (None: the default)."""

    def __init__(self, make: Callable[[int | None], Awaitable[Any]]) -> None:
        self.make = make
        self.producer: Any = None
        self._renewing = asyncio.Lock()  # one renewal at a time

    async def start(self) -> None:
        self.producer = await self.make(None)

    async def renew(self, broken: Any, max_batch: int, units: Iterable[Unit]) -> Any:
        async with self._renewing:
            if self.producer is not broken:  # another unit renewed it already
                return self.producer
            self.producer = await self.make(max_batch)
            for unit in units:
                if unit.producer is broken:
                    unit.producer = self.producer
            log.warning("at least once: a refused record; the shared producer is renewed")
        try:  # its sends in flight end first; a unit whose send fails then is reopened
            await broken.stop()
        except Exception as exc:
            log.debug("the broken shared producer's stop: %r", exc)
        return self.producer

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()


# A commit hands its whole prefix over at once: in large batches it goes out in one
# request per partition instead of one per 16 KB (an idempotent producer has one
# request in flight per partition, so small batches queue behind each other's acks).
_BATCHING: dict[str, int] = {
    "linger_ms": 0,
    "max_batch_size": 1024 * 1024,
    "max_request_size": 8 * 1024 * 1024,
}


@dataclass(frozen=True, slots=True)
class Fetched:
    """A consumed record, the unit of its partition, and the slot it is tracked on."""

    unit: Unit
    record: ConsumerRecord[bytes, bytes]
    slot: Slot


def _identity(client_id: str | None, instance_id: str | None) -> dict[str, Any]:
    """The group consumer's client.id and, for static membership, its instance id: a
    restart under the same name within the session timeout gets its partitions back
    without a rebalance of the whole group (and a leave is not announced: the partitions
    wait out the session timeout)."""
    options: dict[str, Any] = {}
    if client_id:
        options["client_id"] = client_id
    if instance_id:
        options["group_instance_id"] = instance_id
    return options


class Membership(ConsumerRebalanceListener):  # type: ignore[misc]
    """`topics`: the input topic first, then the co-partitioned ones (results,
    approvals). `transactional`: exactly once; else one shared idempotent producer."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topics: list[str],
        *,
        transactional: bool,
        transactional_prefix: str,
        session_timeout_s: float,
        on_open: OnOpen | None = None,
        on_close: Callable[[Unit], None] | None = None,
        replace: Replace | None = None,
        client_id: str | None = None,
        group_instance_id: str | None = None,
        on_rebalance: Callable[[], None] = lambda: None,
        probe: Probe = NO_PROBE,
        request_timeout_ms: int = 30_000,
        commit_interval_s: float = LINGER_S,
    ) -> None:
        self.probe = probe
        self.commit_interval_s = commit_interval_s
        self.batching = {**_BATCHING, "request_timeout_ms": request_timeout_ms}
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topics = topics
        self.input = topics[0]
        self.transactional = transactional
        self.transactional_prefix = transactional_prefix
        self.session_timeout_s = session_timeout_s
        self.on_open = on_open
        self.on_close = on_close
        self.replace = replace
        self.identity = _identity(client_id, group_instance_id)
        self.on_rebalance = on_rebalance
        self.units: dict[int, Unit] = {}
        self.rebalancing = False
        self.rebalances = 0
        self.consumer: AIOKafkaConsumer | None = None
        self._shared = SharedProducer(functools.partial(self._producer, None))
        self._next: dict[TopicPartition, int] = {}  # the next offset each partition owes
        self._failures = Failures()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self.transactional:
            await self._shared.start()
        self.consumer = clients.consumer(
            self.bootstrap,
            group_id=self.group_id,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            # Range second: what the group agrees on while an earlier version is in it.
            partition_assignment_strategy=(CoPartitionedAssignor(), RangePartitionAssignor),
            session_timeout_ms=int(self.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.session_timeout_s * 1000 / 5),
            max_poll_interval_ms=300_000,
            **self.identity,
        )
        self.consumer.subscribe(self.topics, listener=self)
        await self.consumer.start()

    async def stop(self) -> None:
        """Commits what every unit finished, drops them, leaves the group."""
        for p in sorted(self.units):
            await self._close(self.units.pop(p), commit=True)
        if self.consumer is not None:
            await self.consumer.stop()
        await self._shared.stop()

    # ------------------------------------------------------------------ rebalances

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing = True
        self.rebalances += 1
        self.on_rebalance()
        gone = sorted({tp.partition for tp in revoked if tp.topic == self.input})
        for p in gone:
            unit = self.units.pop(p, None)
            if unit is not None:
                await self._close(unit, commit=True)
        for tp in revoked:
            self._next.pop(tp, None)
        if gone:
            log.info("rebalance: partitions %s revoked; their finished work committed", gone)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            new = sorted(
                {tp.partition for tp in assigned if tp.topic == self.input} - set(self.units)
            )
            if new:
                # Side by side: the group waits for this callback, and a member that takes
                # longer than its session timeout is put out of the group.
                await self._open(new)
                log.info("rebalance: partitions %s assigned", new)
        finally:
            self.rebalancing = False

    async def _open(self, partitions: list[int]) -> None:
        """Units for `partitions`: their producers first (fencing), then the consumer
        sought to the committed offsets of their three topics."""
        units = await asyncio.gather(*(self._unit(p) for p in partitions))
        if self.on_open is not None:
            await asyncio.gather(*(self.on_open(u) for u in units))
        await self._seek(partitions)
        for unit in units:
            unit.start()
            self.units[unit.partition] = unit

    async def _unit(self, partition: int) -> Unit:
        # At least once: one shared producer, and the consumer commits the offsets.
        shared = not self.transactional
        return Unit(
            partition,
            self._shared.producer if shared else await self._producer(partition),
            group_id=self.group_id,
            transactional=self.transactional,
            commit_offsets=self._commit if shared else None,
            refusals=self._refusals(None if shared else partition),
            probe=self.probe,
            linger_s=self.commit_interval_s,
        )

    async def _producer(self, partition: int | None, max_batch: int | None = None) -> Any:
        """Partition p's transactional producer, or (None) the shared idempotent one."""
        batching = dict(self.batching)
        if max_batch is not None:
            batching["max_batch_size"] = max(1024, min(max_batch, batching["max_batch_size"]))
        ids = (
            {}
            if partition is None
            else {"transactional_id": f"{self.transactional_prefix}.{partition}"}
        )
        producer = clients.producer(self.bootstrap, **ids, **batching)
        await producer.start()
        return producer

    def _refusals(self, partition: int | None) -> Refusals | None:
        if self.replace is None:
            return None

        async def limits(topics: set[str]) -> dict[str, int]:
            return await record_limits(self.bootstrap, topics)

        async def renew(broken: Any, max_batch: int) -> Any:
            if partition is None:
                return await self._shared.renew(broken, max_batch, self.units.values())
            await broken.stop()  # before its successor fences it
            return await self._producer(partition, max_batch)

        return Refusals(self.replace, limits, renew)

    async def _seek(self, partitions: list[int]) -> None:
        assert self.consumer is not None
        owned = self.consumer.assignment()
        tps = [TopicPartition(t, p) for p in partitions for t in self.topics]
        tps = [tp for tp in tps if tp in owned]
        committed = await asyncio.gather(*(self.consumer.committed(tp) for tp in tps))
        fresh = [tp for tp, offset in zip(tps, committed, strict=True) if offset is None]
        starts = await self.consumer.beginning_offsets(fresh) if fresh else {}
        for tp, offset in zip(tps, committed, strict=True):
            at = starts[tp] if offset is None else offset
            self.consumer.seek(tp, at)
            self._next[tp] = at

    async def _close(self, unit: Unit, *, commit: bool) -> None:
        await unit.close(commit=commit)
        if self.on_close is not None:
            self.on_close(unit)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert self.consumer is not None
        await self.consumer.commit(offsets)

    async def heal(self) -> None:
        """Reopens each failed unit of a partition still owned here (see `Failures`)."""
        now = time.monotonic()
        for p, unit in list(self.units.items()):
            if not self._failures.due(p, unit, now):
                continue
            log.warning(
                "partition %d: unit failed (%r); reopened from its last commit", p, unit.failed
            )
            self.units.pop(p)
            await self._close(unit, commit=False)
            try:
                await self._open([p])
            except Exception as exc:  # the broker still away: tried again after the wait
                log.warning("partition %d: reopening failed: %r", p, exc)
                unit.failed, self.units[p] = exc, unit

    # ------------------------------------------------------------------ fetching

    async def fetch(self, timeout_ms: int, max_records: int) -> list[Fetched]:
        """The next records, each tracked on a slot of its partition's unit. A record
        before where its partition was last sought (fetched before the seek) is left out."""
        assert self.consumer is not None
        found = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Fetched] = []
        for tp, records in found.items():
            unit = self.units.get(tp.partition)
            if unit is None or not unit.alive:
                continue
            expected = self._next.get(tp, -1)
            for rec in records:
                if rec.offset < expected:
                    continue
                slot = unit.track(tp.topic, rec.offset, traceparent_of(rec.headers))
                out.append(Fetched(unit, rec, slot))
                expected = rec.offset + 1
            self._next[tp] = expected
            # Tracked up to the position: markers and aborted records after the last
            # record are passed too when nothing is open (see Unit.seen).
            unit.seen(tp.topic, await self.consumer.position(tp))
        return out

    def input_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(self.input, p) for p in sorted(self.units)]

    def hold_input(self, hold: bool) -> None:
        """Backpressure: while held, fetches leave the input out (results and approvals
        still flow), and the group does not think this member stalled."""
        assert self.consumer is not None
        paused = self.consumer.paused()
        if hold:
            tps = [tp for tp in self.input_partitions() if tp not in paused]
            if tps:
                self.consumer.pause(*tps)
        else:
            tps = [tp for tp in paused if tp.topic == self.input]
            if tps:
                self.consumer.resume(*tps)

    async def lag(self) -> dict[int, int]:
        """Per owned input partition, records not committed yet (end - committed)."""
        assert self.consumer is not None
        out: dict[int, int] = {}
        for tp in self.input_partitions():
            end = self.consumer.highwater(tp)
            unit = self.units.get(tp.partition)
            oldest = unit.oldest_open(tp.topic) if unit is not None else None
            position = oldest if oldest is not None else self._next.get(tp)
            if end is not None and position is not None:
                out[tp.partition] = max(0, end - position)
        return out
