"""The state store of one unit: instance states of partition p, restored read_committed
from partition p of the compacted changelog before the unit takes work, and changed only
through the unit's transactions (docs/architecture.md, exactly once).

A state changes only through a transaction (`Stores.change`, runtime/state/transaction.py);
once committed it is written here at once (later work of this unit reads it) and the
write returns its changelog record, which the transaction hands to whoever made the
change, to stage with the outcome it belongs to, so the change and its outputs commit
together or not at all. An aborted or fenced unit is dropped with its store; the next
owner restores what was committed. A change whose record would pass the broker's limit is
refused before anything is stored or staged. Reading the changelog partition and setting aside the
records that cannot be read are the reader's (`changelog.ChangelogReader`); the store
applies what it read.

A finished workflow's state (done) leaves memory once its changelog record
is written: until its retention is over (when its tombstone is written, as before) the
store keeps only where that record is and when the workflow ended (`Retired`). A repeated
answer or a new input of the instance reads it back first (`Stores.recall`, one fetch by
offset); a `get` of a retired state that was not read back is a bug, and raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from instanced_stream.core.state import InstanceState, Write
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.state.changelog import ChangelogReader, Quarantined
from instanced_stream.runtime.state.changes import next_change
from instanced_stream.runtime.state.idea_tally import IdeaTally, share_of
from instanced_stream.runtime.state.recall import Recall, RecallFailed
from instanced_stream.runtime.state.transaction import Transaction

__all__ = ["NotRecalled", "OutsideChange", "Retired", "Stores", "UnitStore"]

log = logging.getLogger("stream.store")


def _ended_at(st: InstanceState) -> float | None:
    """When the workflow ended, if it is done: nothing reads it then but a repeated answer,
    a new input of its instance, and the deletion at the end of its retention."""
    if st.status == "done" and st.ended is not None:
        return st.ended.at
    return None


class Retired(NamedTuple):
    """A finished state kept only on the changelog: its record's offset, when it ended."""

    offset: int
    ended_at: float


class NotRecalled(RuntimeError):
    """A retired state was read without `Stores.recall` first (a bug)."""


class OutsideChange(RuntimeError):
    """A state was put or deleted on the stores directly, not in a change (a bug: its
    changelog record would be staged with no outcome)."""


# Read-back states a store keeps parsed, the latest first out: what a recall is for is
# read in the same step, so a few suffice; more spare a repeat's second fetch.
_RECALLED = 256


# Keys changed since the last restore that a store remembers the restored value of; past
# it, its next restore reads the whole partition again instead of the delta (the
# remembered values would cost as much memory as the states).
_UNDO_LIMIT = 10_000

# Restored records between two yields to the event loop: a restore runs beside the
# consumer's heartbeats and the other units' work, never blocking them for long.
_YIELD_EVERY = 500


class UnitStore:
    def __init__(self, topic: str, partition: int, max_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        self.max_bytes = max_bytes
        self._raw: dict[str, bytes] = {}  # the live states' JSON
        self._parsed: dict[str, InstanceState] = {}  # the same, parsed (not the finished)
        # Finished states put here whose record is not written yet, with when they ended:
        # once it is (`written`), they retire.
        self._ending: dict[str, float] = {}
        self._retired: dict[str, Retired] = {}  # finished states, on the changelog only
        self._recalled: OrderedDict[str, InstanceState] = OrderedDict()
        # Reads the changelog partition, knows how far, and holds its unreadable records.
        self.changelog = ChangelogReader(topic, partition)
        # Each key changed here since the last restore, with its value as restored (None:
        # none). A change is committed or not with its unit's transaction; when this store
        # is restored again (its unit reopened), a key the changelog did not change since
        # goes back to that value: nothing uncommitted outlives its unit.
        self._base: dict[str, bytes | Retired | None] | None = {}
        # The partition's Idea Process counts: of the committed states only, set by each
        # restore from what it reads and by each commit (runtime/state/idea_tally.py).
        self.ideas = IdeaTally()

    def __contains__(self, instance: str) -> bool:
        return instance in self._raw or instance in self._retired

    def __len__(self) -> int:
        return len(self._raw) + len(self._retired)

    @property
    def retired_count(self) -> int:
        return len(self._retired)

    @property
    def applied(self) -> int:
        """The next changelog offset a restore reads (`ChangelogReader.applied`)."""
        return self.changelog.applied

    @property
    def restored(self) -> int:
        """Records read by the restore in progress (`ChangelogReader.restored`)."""
        return self.changelog.restored

    @property
    def quarantined(self) -> list[Quarantined]:
        """Unreadable records not yet staged (`ChangelogReader.quarantined`)."""
        return self.changelog.quarantined

    async def restore(self, bootstrap: str, gate: asyncio.Semaphore | None = None) -> int:
        """Reads the changelog partition from where this store left it (`applied`: all of
        it the first time, only the delta after) to its last stable offset,
        read_committed; returns the states it holds. Every state is read as it is
        restored: one that cannot be (a cut-off value, another schema) is left out and
        kept in `quarantined`, so the partition opens without it. A finished one retires
        at once: only its offset stays. A large read (`ChangelogReader.read`) holds `gate`
        until its records are parsed (they are held until then)."""
        if self._base is None:  # too much changed to undo: everything read again
            self._raw, self._parsed, self._retired, self._base = {}, {}, {}, {}
            self._ending, self._recalled = {}, OrderedDict()
            self.ideas.reset()
            self.changelog.rewind()
        undo, self._base = self._base, {}
        async with contextlib.AsyncExitStack() as gated:
            latest = await self.changelog.read(bootstrap, gate, gated)
            return await self._apply(dict(latest), undo)

    async def _apply(
        self,
        latest: dict[str, tuple[int, bytes | Retired | None]],
        undo: dict[str, bytes | Retired | None],
    ) -> int:
        for key, base in undo.items():  # changed here, not committed since: undone
            latest.setdefault(key, (-1, base))
        self.changelog.requarantine(latest)  # staged before, its tombstone not read back
        for n, (key, (offset, raw)) in enumerate(latest.items()):
            if n % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
            self._forget(key)
            if raw is None:
                self.ideas.apply({key: None})
                continue
            if isinstance(raw, Retired):
                self._retired[key] = raw
                continue
            parsed = self.changelog.parse(key, offset, raw)
            if offset >= 0:  # read from the changelog: committed (an undone key: as counted)
                self.ideas.apply({key: None if parsed is None else share_of(parsed)})
            if parsed is None:  # unreadable: quarantined by the reader
                continue
            ended = _ended_at(parsed)
            if ended is not None and offset >= 0:  # see the module's docstring
                self._retired[key] = Retired(offset, ended)
            else:
                self._raw[key], self._parsed[key] = raw, parsed
        return len(self)

    def quarantine(self) -> list[tuple[Quarantined, OutRecord]]:
        """The unreadable records found so far, each to be staged once: with its dead
        letter goes its key's tombstone (returned here), in one transaction, so a later
        restore finds it no more."""
        return [
            (bad, OutRecord(self.topic, bad.key.encode(), b"", None, self.partition))
            for bad in self.changelog.take()
        ]

    def get(self, instance: str) -> InstanceState | None:
        parsed = self._parsed.get(instance)
        if parsed is None:
            raw = self._raw.get(instance)
            if raw is not None:  # finished, its record not written yet: read, not kept
                return InstanceState.model_validate_json(raw)
            if instance not in self._retired:
                return None
            parsed = self._recalled.get(instance)
            if parsed is None:
                raise NotRecalled(f"the finished state of {instance!r} was not read back")
        # A copy: the workflow changes what it gets, and puts it back when it means to.
        return parsed.model_copy(deep=True)

    def retired(self) -> Iterator[tuple[str, float, int]]:
        """Each retired state's instance, when it ended, and this partition."""
        for instance, (_, ended) in list(self._retired.items()):
            yield instance, ended, self.partition

    def retired_at(self, instance: str) -> float | None:
        found = self._retired.get(instance)
        return found.ended_at if found is not None else None

    def to_recall(self, instance: str) -> int | None:
        """The offset to read `instance`'s state back from, if it is retired and not read
        back already."""
        found = self._retired.get(instance)
        if found is None or instance in self._recalled:
            return None
        return found.offset

    def recalled(self, instance: str, offset: int, raw: bytes) -> None:
        """The state read back from `offset`; ignored if it changed meanwhile."""
        found = self._retired.get(instance)
        if found is None or found.offset != offset:
            return
        self._recalled[instance] = InstanceState.model_validate_json(raw)
        if len(self._recalled) > _RECALLED:
            self._recalled.popitem(last=False)

    def encoded(self, value: InstanceState) -> bytes:
        """`value` as its changelog record's value; BadRecord if it would pass the broker's
        limit (nothing is stored then)."""
        raw = value.model_dump_json().encode()
        if len(raw) + len(value.instance.encode()) > self.max_bytes:
            raise BadRecord(
                "too_large",
                f"the state of {value.instance} would be {len(raw)} bytes; a changelog "
                f"record takes at most {self.max_bytes} (settings.max_output_bytes)",
            )
        return raw

    def put(self, value: InstanceState, raw: bytes | None = None) -> OutRecord:
        """Stores `value` (`raw`: already `encoded`); returns its changelog record."""
        key = value.instance.encode()
        raw = self.encoded(value) if raw is None else raw
        self._changing(value.instance)
        self._forget(value.instance)
        self._raw[value.instance] = raw
        ended = _ended_at(value)
        if ended is not None:  # it leaves memory once its record is written
            self._ending[value.instance] = ended
        else:
            self._parsed[value.instance] = value.model_copy(deep=True)
        return OutRecord(self.topic, key, raw, None, self.partition, seq=next_change())

    def written(self, key: bytes | None, value: bytes, offset: int) -> None:
        """A changelog record of this store was committed at `offset`: a finished state
        whose latest value it is retires."""
        instance = key.decode() if key else ""
        ended = self._ending.get(instance)
        if ended is not None and self._raw.get(instance) is value:
            del self._ending[instance], self._raw[instance]
            self._retired[instance] = Retired(offset, ended)

    def delete(self, instance: str) -> OutRecord | None:
        """Forgets `instance`; returns its tombstone (None: it was not here)."""
        if instance not in self:
            return None
        self._changing(instance)
        self._forget(instance)
        # An empty value: the unit sends it as null, a tombstone.
        return OutRecord(
            self.topic, instance.encode(), b"", None, self.partition, seq=next_change()
        )

    def _forget(self, instance: str) -> None:
        for held in (self._raw, self._parsed, self._ending, self._retired, self._recalled):
            held.pop(instance, None)

    def _changing(self, instance: str) -> None:
        if self._base is not None:
            self._base.setdefault(instance, self._raw.get(instance) or self._retired.get(instance))
            if len(self._base) > _UNDO_LIMIT:
                self._base = None

    def peek(self) -> Iterator[InstanceState]:
        """Every live state as stored, not copied: for readers that change nothing (the
        retired ones are not read: `retired`)."""
        for instance, raw in list(self._raw.items()):
            parsed = self._parsed.get(instance)
            yield parsed or InstanceState.model_validate_json(raw)

    def states(self) -> Iterator[InstanceState]:
        """Every live state, copied (the retired ones: `retired`)."""
        for instance in list(self._raw):
            found = self.get(instance)
            if found is not None:
                yield found


class Stores:
    """The stores of the units this process owns, as one `StateStore` for the workflow:
    an instance lives in the store of its input's partition."""

    def __init__(self, reader: Recall | None = None) -> None:
        self.by_partition: dict[int, UnitStore] = {}
        self.reader = reader  # reads retired states back (none: nothing retires unread)
        self._reading: dict[str, asyncio.Future[None]] = {}  # read-backs under way

    async def recall(self, instance: str) -> None:
        """Reads back the state of `instance` if an owned store keeps it only on the
        changelog (a finished workflow), so a `get` in the same step finds it. Raises
        `RecallFailed` when it cannot be read. Callers asking for the same instance at
        once (its result's lane and its new input's intake) share one read."""
        reading = self._reading.get(instance)
        if reading is None:
            reading = self._reading[instance] = asyncio.ensure_future(self._recall(instance))
            reading.add_done_callback(lambda _done: self._reading.pop(instance, None))
        await asyncio.shield(reading)

    async def _recall(self, instance: str) -> None:
        for _ in range(3):  # its store replaced during the read (a unit reopened): again
            store = self._holding(instance)
            offset = store.to_recall(instance) if store is not None else None
            if store is None or offset is None:
                return
            if self.reader is None:
                raise RecallFailed(f"the state of {instance!r} is retired: no reader")
            store.recalled(
                instance, offset, await self.reader.read(store.partition, offset, instance)
            )
        raise RecallFailed(f"the state of {instance!r} kept changing while read back")

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.stop()

    def held(self) -> tuple[int, int, int]:
        """States live (in memory) and retired here, and states read back so far."""
        retired = sum(s.retired_count for s in self.by_partition.values())
        held = sum(len(s) for s in self.by_partition.values())
        return held - retired, retired, self.reader.reads if self.reader else 0

    def retired(self) -> Iterator[tuple[str, float, int]]:
        """Each retired state's instance, when it ended, and its partition."""
        for store in list(self.by_partition.values()):
            yield from store.retired()

    def retired_at(self, instance: str) -> float | None:
        """When the workflow of `instance` ended, if its state is retired."""
        store = self._holding(instance)
        return store.retired_at(instance) if store is not None else None

    def written(self, partition: int, record: OutRecord, offset: int) -> None:
        """A committed changelog record of `partition` (the unit's hook)."""
        store = self.by_partition.get(partition)
        if store is not None and record.value:
            store.written(record.key, record.value, offset)

    def add(self, store: UnitStore) -> None:
        self.by_partition[store.partition] = store

    def drop(self, partition: int) -> None:
        self.by_partition.pop(partition, None)

    def _holding(self, instance: str) -> UnitStore | None:
        for store in self.by_partition.values():
            if instance in store:
                return store
        return None

    def partition_of(self, instance: str) -> int | None:
        """The owned partition whose store holds `instance`, if any."""
        store = self._holding(instance)
        return store.partition if store is not None else None

    def get(self, instance: str) -> InstanceState | None:
        store = self._holding(instance)
        return store.get(instance) if store is not None else None

    def change(self) -> Transaction:
        """A state change over these stores, made as one: `with stores.change() as tx:`
        (runtime/state/transaction.py)."""
        return Transaction(self)

    def encoded(self, write: Write) -> bytes | None:
        """The changelog value of `write` (None: a deletion, or a partition not owned
        here); BadRecord if it would pass the broker's limit."""
        store = self.by_partition.get(write.partition)
        if store is None or write.state is None:
            return None
        return store.encoded(write.state)

    def write(self, write: Write, raw: bytes | None = None) -> OutRecord | None:
        """Stores `write` (`raw`: its value, `encoded`); returns its changelog record, None
        where nothing was written."""
        store = self.by_partition.get(write.partition)
        if store is None:
            # Its partition moved away while the change was being made: the new owner
            # redoes it from the last commit; nothing is stored here.
            log.info(
                "state of %s not stored: partition %d is not owned here",
                write.instance,
                write.partition,
            )
            return None
        if write.state is None:
            return store.delete(write.instance)
        return store.put(write.state, raw)

    def put(self, value: InstanceState) -> None:
        raise OutsideChange(f"the state of {value.instance!r} was put outside a change")

    def items(self) -> Iterator[InstanceState]:
        """Every live state (the retired ones: `retired`)."""
        for store in list(self.by_partition.values()):
            yield from store.states()

    def delete(self, instance: str, partition: int) -> None:
        raise OutsideChange(f"the state of {instance!r} was deleted outside a change")

    async def flush(self) -> None:
        """Nothing to wait for: changes become durable with their unit's transaction."""
