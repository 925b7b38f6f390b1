"""The unit: one owned input partition p, its producer, what is staged on it, its commits.

Exactly once (docs/architecture.md): the unit's producer is transactional with an id
stable per partition (`<app id>.<input topic>.<p>`), so starting it fences any earlier
owner of p: a zombie's later commits fail with `ProducerFenced`. Every record the
processor consumed at p (input, results, approvals: co-partitioned) is tracked in a slot;
when its outcome is known, its output records (and state changes) are staged on the slot.
A commit takes each topic's finished, contiguous prefix of slots and writes, in one
transaction, their outputs in offset order (so each instance's outputs keep its input
order) and the offsets after them. A crash, a revocation or a fencing before the commit
leaves nothing visible to read_committed consumers; the next owner redoes that prefix.

At least once uses the same units with one shared idempotent producer: the prefix's
records are sent and acknowledged, then its offsets are committed by the consumer.

The unit is the commit protocol (begin, write, commit or abort; fenced, it is void);
sending the records, the records the broker refuses and the producer a refusal broke
are its record collector's (`collector.RecordCollector`), which owns the producer.

Whether a unit still serves is not recorded on it: its `Owner` answers (the partition's
lifecycle, runtime/units/lifecycle.py, for the units of a member; `Alone` for a unit
that has no member). A unit that fails tells its owner at once, which moves its
partition's state; whoever then stages on it gets `UnitGone`, as Kafka Streams' callers
get `TaskMigratedException`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaError,
    ProducerFenced,
)
from aiokafka.structs import TopicPartition

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.tracing import Headers
from instanced_stream.runtime.state.changes import ChangeOrder, last_change
from instanced_stream.runtime.units.collector import RecordCollector, Refusals, Refused

__all__ = [
    "LINGER_S",
    "Alone",
    "Annex",
    "CommitOffsets",
    "Owner",
    "Slot",
    "Unit",
    "UnitGone",
    "Written",
    "oldest_open_since",
    "uncommitted",
]

log = logging.getLogger("stream.unit")

# Work finished within this long after the first is committed in the same transaction
# (STREAM_COMMIT_INTERVAL): a transaction costs four round trips, so under load many
# batches share one, and a lone item still waits no more than this for its outcome to
# become visible.
LINGER_S = 0.05

CommitOffsets = Callable[[dict[TopicPartition, int]], Awaitable[None]]
# A committed state change (a changelog record of the unit's partition) and its offset.
Written = Callable[[int, OutRecord, int], None]


class Annex(Protocol):
    """Records a commit adds about its own records, in its own transaction (the Idea
    Process share of the partition: runtime/state/idea_tally.py `IdeaShare`)."""

    def staged(self, records: list[OutRecord]) -> list[OutRecord]: ...

    def committed(self) -> None: ...


class UnitGone(Exception):
    """The unit no longer serves its partition here (moved away, fenced or failed: its
    owner let it go): what was staged on it is void, and the partition's next unit redoes
    it from the last commit. A revoked unit that is only suspended still serves."""


class Owner(Protocol):
    """Who holds a unit: the one record of whether it still serves its partition."""

    def holds(self, unit: Unit) -> bool:
        """Whether `unit` still serves its partition (takes work, commits)."""
        ...

    def failed(self, unit: Unit, exc: BaseException) -> None:
        """`unit` can commit no more: its partition's state moves now (nothing waits for
        a later look to find it void)."""
        ...

    def closed(self, unit: Unit) -> None:
        """`unit` was closed (its producer stopped)."""
        ...


class Alone:
    """The owner of a unit that belongs to no member (a tool, a test): it holds the unit
    until the unit fails or is closed, and keeps what it failed with."""

    def __init__(self) -> None:
        self.gone: set[int] = set()  # id() of the units it let go
        self.failures: dict[int, BaseException] = {}

    def holds(self, unit: Unit) -> bool:
        return id(unit) not in self.gone

    def failed(self, unit: Unit, exc: BaseException) -> None:
        self.gone.add(id(unit))
        self.failures[id(unit)] = exc

    def closed(self, unit: Unit) -> None:
        self.gone.add(id(unit))


@dataclass(slots=True, eq=False)
class Slot:
    """One consumed record at the unit's partition, and what its outcome stages."""

    topic: str
    offset: int
    headers: Headers = ()
    done: bool = False
    records: list[OutRecord] = field(default_factory=list)
    at: float = field(default_factory=time.monotonic)  # when it was consumed
    since: int = field(default_factory=last_change)  # the changes made before it was


class Unit:
    """Owned input partition `partition`. `producer`: transactional (exactly once, owned by
    the unit and closed with it) or shared (at least once, with `commit_offsets` doing the
    consumer's commit)."""

    def __init__(
        self,
        partition: int,
        producer: AIOKafkaProducer,
        *,
        group_id: str,
        transactional: bool,
        commit_offsets: CommitOffsets | None = None,
        refusals: Refusals | None = None,
        probe: Probe = NO_PROBE,
        linger_s: float = LINGER_S,
        owner: Owner | None = None,
    ) -> None:
        self.partition, self.linger_s = partition, linger_s
        self.probe = probe  # the fault campaign's points: mid_commit, after_commit
        # Sends the records, replaces the refused ones, renews the producer they broke.
        self.collector = RecordCollector(partition, producer, refusals)
        self.group_id = group_id
        self.transactional = transactional
        self.commit_offsets = commit_offsets
        # Answers whether the unit serves, and is told at once when it fails (a member
        # sets its lifecycle here when it takes the unit).
        self.owner: Owner = owner if owner is not None else Alone()
        self.failed: BaseException | None = None  # the cause, for the logs: not a state
        self.slots: dict[str, deque[Slot]] = {}
        # Per topic, the consumer's position after the records handed out so far: past
        # transaction markers and aborted records, which are never handed out.
        self._seen: dict[str, int] = {}
        self._committed: dict[str, int] = {}  # the offsets this unit committed last
        self._free: list[OutRecord] = []  # outputs tied to no consumed record (next turns)
        self._in_order = ChangeOrder()  # its state changes, written in the order made
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.committed_records = 0
        self.written: Written | None = None  # told of each committed state change
        self.annex: Annex | None = None  # adds its records to each commit's

    def __repr__(self) -> str:
        return f"Unit(p={self.partition}, held={self.held})"

    @property
    def held(self) -> bool:
        """Whether its owner still holds it: asked of the owner (the partition's lifecycle)
        each time, never kept here."""
        return self.owner.holds(self)

    @property
    def producer(self) -> AIOKafkaProducer:
        """The producer the unit's transactions run on (its collector's: renewed there)."""
        return self.collector.producer

    # ------------------------------------------------------------------ staging

    def track(self, topic: str, offset: int, headers: Headers = ()) -> Slot:
        """A consumed record; its offset is committed only once its slot is finished."""
        self.check()
        slot = Slot(topic, offset, headers)
        self.slots.setdefault(topic, deque()).append(slot)
        return slot

    def seen(self, topic: str, position: int) -> None:
        """Every record of `topic` before `position` was handed out and tracked here."""
        if position > self._seen.get(topic, -1):
            self._seen[topic] = position
            self._wake.set()

    def finish(self, slot: Slot, records: Iterable[OutRecord] = ()) -> None:
        """The slot's outcome: these records are written with its offset, atomically."""
        self.check()
        slot.records.extend(_traced(records, slot.headers))
        slot.done = True
        self._wake.set()

    def stage(self, records: Iterable[OutRecord]) -> None:
        """Outputs tied to no consumed record here (a workflow's next turn): they go out
        with the next commit."""
        self.check()
        self._free.extend(records)
        self._wake.set()

    def open_slots(self) -> int:
        return sum(1 for slots in self.slots.values() for s in slots if not s.done)

    def oldest_open(self, topic: str) -> int | None:
        """The first offset of `topic` still waiting for its outcome."""
        for slot in self.slots.get(topic, ()):
            if not slot.done:
                return slot.offset
        return None

    def fail(self, exc: BaseException) -> None:
        """Voids the unit (a bug while staging on it): its owner replaces it, and the
        uncommitted prefix is redone from the last commit."""
        if self._void(exc):
            log.error("partition %d: staging failed, the unit is dropped: %r", self.partition, exc)

    def _void(self, exc: BaseException) -> bool:
        """The unit can commit no more: its owner is told at once, and moves its
        partition's state. False: it was void already."""
        if not self.held:
            return False
        self.failed = exc
        self.owner.failed(self, exc)
        return True

    def check(self) -> None:
        """Raises `UnitGone` once its owner no longer holds it."""
        if not self.held:
            raise UnitGone(f"partition {self.partition} is no longer owned here")

    # ------------------------------------------------------------------ commits

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"unit-{self.partition}")

    async def _run(self) -> None:
        try:
            while self.held:
                await self._wake.wait()
                await asyncio.sleep(self.linger_s)
                await self.commit()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the unit is void; its owner replaces it
            self._void(exc)
            log.error("partition %d: commit failed, the unit is dropped: %r", self.partition, exc)

    def _take(self) -> tuple[list[OutRecord], dict[str, int]]:
        """Pops each topic's finished, contiguous prefix: its records in offset order,
        and the offset to commit per topic."""
        records: list[OutRecord] = []
        offsets: dict[str, int] = {}
        for topic in self.slots.keys() | self._seen.keys():
            slots = self.slots.get(topic) or deque()
            while slots and slots[0].done:
                slot = slots.popleft()
                records.extend(slot.records)
                offsets[topic] = slot.offset + 1
            seen = self._seen.get(topic)
            last = offsets.get(topic, self._committed.get(topic, -1))
            if not slots and seen is not None and seen > last:
                # Nothing open: the commit goes past the markers and aborted records
                # after the last record, so a transactional upstream leaves no lag.
                offsets[topic] = seen
        for topic, offset in offsets.items():
            self._committed[topic] = offset
        records.extend(self._free)
        self._free = []
        return self._in_order(records, self.slots.values()), offsets

    async def commit(self) -> int:
        """Commits what is finished; returns how many records it wrote. Raises when the
        unit can no longer commit (fenced, or the transaction failed): its owner was told,
        and the prefix is redone by whoever owns the partition next."""
        async with self._lock:
            if not self.held:
                return 0
            self._wake.clear()
            records, offsets = self._take()
            if not records and not offsets:
                return 0
            if self.annex is not None:
                records = [*records, *self.annex.staged(records)]
            tps = {TopicPartition(t, self.partition): o for t, o in offsets.items()}
            try:
                records, offsets_written = await self._write(records, tps)
            except ProducerFenced as exc:
                self._void(exc)
                raise
            except asyncio.CancelledError:  # closed meanwhile: its closer knows
                if self.transactional:
                    await self._abort()
                raise
            except Exception as exc:
                self._void(exc)
                if self.transactional:
                    await self._abort()
                raise
            if self.annex is not None:
                self.annex.committed()
            self.commits += 1
            self.committed_records += len(records)
            _tell(self.written, self.partition, records, offsets_written)
            self.probe.at("after_commit")
            return len(records)

    async def _write(
        self, records: list[OutRecord], offsets: dict[TopicPartition, int]
    ) -> tuple[list[OutRecord], list[int]]:
        """Writes the records and the offsets; a record the broker refuses for itself is
        replaced (its item's dead letter) and the whole is written again, so one bad
        record neither loops the unit nor holds its batch-mates back. Returns the records
        written and where each one was."""
        for _ in range(3):
            try:
                if self.transactional:
                    at = await self._commit_transaction(records, offsets)
                else:
                    at = await self.collector.send(records)
                    self.probe.at("mid_commit")
                    if offsets and self.commit_offsets is not None:
                        await self.commit_offsets(offsets)
                return records, at
            except Refused as exc:
                if self.transactional:
                    await self.producer.abort_transaction()
                records = await self.collector.replaced(records, exc)
        raise RuntimeError("records kept being refused after their replacement")

    async def _commit_transaction(
        self, records: list[OutRecord], offsets: dict[TopicPartition, int]
    ) -> list[int]:
        await self.producer.begin_transaction()
        at = await self.collector.send(records)
        if offsets:
            await self.producer.send_offsets_to_transaction(offsets, self.group_id)
        self.probe.at("mid_commit")  # every record sent, the transaction still open
        await self.producer.commit_transaction()
        return at

    async def _abort(self) -> None:
        try:
            await self.producer.abort_transaction()
        except (KafkaError, AssertionError) as exc:  # fenced or broken: nothing to undo
            log.debug("partition %d: abort not possible: %r", self.partition, exc)

    async def close(self, *, commit: bool) -> None:
        """Stops the unit. `commit`: what is finished is committed first (a graceful
        revocation or shutdown); otherwise, and for whatever is unfinished, the next owner
        redoes it. A transactional producer is closed with its unit."""
        if self._task is not None:
            if commit:
                # A commit of its own under way is let finish first: cancelled, it aborted
                # its transaction and voided the unit, and what the drain had just
                # delivered was left for the next owner to ask the model again.
                async with self._lock:
                    self._task.cancel()
            else:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if commit and self.held:
            try:
                await self.commit()
            except Exception as exc:
                log.warning("partition %d: last commit failed: %r", self.partition, exc)
        self.owner.closed(self)
        self.slots.clear()
        self._free = []
        if self.transactional:
            try:
                await self.producer.stop()
            except Exception as exc:  # a fenced producer may refuse to stop cleanly
                log.debug("partition %d: producer stop: %r", self.partition, exc)


def uncommitted(units: Mapping[int, Unit]) -> dict[str, int]:
    """Per unit held, its consumed records whose offsets are not committed yet (the records
    of a commit under way excepted): what a crash now would leave to be redone."""
    return {str(p): sum(map(len, u.slots.values())) for p, u in sorted(units.items()) if u.held}


def oldest_open_since(unit: Unit) -> float | None:
    """When the oldest record still waiting for its outcome at `unit` was consumed
    (monotonic seconds)."""
    firsts = [next((s.at for s in slots if not s.done), None) for slots in unit.slots.values()]
    return min((at for at in firsts if at is not None), default=None)


def _tell(written: Written | None, partition: int, records: list[OutRecord], at: list[int]) -> None:
    """Tells `written` of each state change among the committed records, and its offset."""
    if written is not None:
        for rec, offset in zip(records, at, strict=True):
            if rec.seq > 0:  # a state change
                written(partition, rec, offset)


def _traced(records: Iterable[OutRecord], headers: Headers) -> Iterable[OutRecord]:
    """The consumed record's traceparent on every record its outcome writes."""
    if not headers:
        return records
    return [r if r.headers else replace(r, headers=headers) for r in records]
