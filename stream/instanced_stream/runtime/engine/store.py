"""The state store of one unit: instance states of partition p, restored read_committed
from partition p of the compacted changelog before the unit takes work, and changed only
through the unit's transactions (docs/architecture.md, exactly once).

A `put` changes the store at once (later work of this unit reads it) and queues the
changelog record; whoever made the change takes the queued records (`take`) and stages
them with the outcome they belong to, so the change and its outputs commit together or
not at all. An aborted or fenced unit is dropped with its store; the next owner restores
what was committed. A change whose record would pass the broker's limit is refused before
anything is stored or staged.

A finished workflow's state (done, owing nothing) leaves memory when it ends: until its
retention is over (when its tombstone is written, as before) the store keeps it only
compressed, never parsed; it is read back, rarely, by a repeated answer or a new input of
the same instance.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Iterator

from aiokafka.structs import TopicPartition

from instanced_stream.core.state import InstanceState
from instanced_stream.errors import BadRecord
from instanced_stream.kafka import clients
from instanced_stream.kafka.publish import OutRecord
from instanced_stream.runtime.engine.changes import next_change

__all__ = ["Stores", "UnitStore", "read_changelog"]

log = logging.getLogger("stream.store")

# A stored value is the state's JSON (an object: it begins with `{`) or, for a finished
# workflow, that JSON compressed (zlib's stream begins with 0x78, `x`): told apart by the
# first byte, whoever filled the store (a put, a restore).
_PACKED = b"x"


def _finished(st: InstanceState) -> bool:
    """A workflow that ended and owes nothing: nothing reads it but a repeated answer, a
    new input of its instance, and the deletion at the end of its retention."""
    return st.status == "done" and st.ended is not None and not st.outbox


def _unpacked(raw: bytes) -> bytes:
    return zlib.decompress(raw) if raw[:1] == _PACKED else raw


async def read_changelog(bootstrap: str, topic: str, partition: int) -> dict[str, bytes]:
    """A compacted changelog partition as it stands: read read_committed to its last
    stable offset, each key's latest value, deleted keys (tombstones) left out."""
    tp = TopicPartition(topic, partition)
    out: dict[str, bytes] = {}
    consumer = clients.consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            found = await consumer.getmany(tp, timeout_ms=1000)
            for rec in found.get(tp, []):
                key = rec.key.decode() if rec.key else None
                if key is None:
                    continue
                if rec.value:
                    out[key] = rec.value
                else:
                    out.pop(key, None)
    finally:
        await consumer.stop()
    return out


class UnitStore:
    def __init__(self, topic: str, partition: int, max_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        self.max_bytes = max_bytes
        self._raw: dict[str, bytes] = {}
        self._parsed: dict[str, InstanceState] = {}
        self._queued: list[OutRecord] = []

    def __contains__(self, instance: str) -> bool:
        return instance in self._raw

    def __len__(self) -> int:
        return len(self._raw)

    async def restore(self, bootstrap: str) -> int:
        """Reads the changelog partition to its last stable offset; returns the states."""
        self._raw.update(await read_changelog(bootstrap, self.topic, self.partition))
        return len(self._raw)

    def get(self, instance: str) -> InstanceState | None:
        raw = self._raw.get(instance)
        if raw is None:
            return None
        parsed = self._parsed.get(instance)
        if parsed is None:
            parsed = InstanceState.model_validate_json(_unpacked(raw))
            if _finished(parsed):  # read once (a restore's scan): kept packed, not parsed
                if raw[:1] != _PACKED:
                    self._raw[instance] = zlib.compress(raw, 1)
                return parsed  # nobody else holds it: no copy needed
            self._parsed[instance] = parsed
        # A copy: the workflow changes what it gets, and puts it back when it means to.
        return parsed.model_copy(deep=True)

    def put(self, value: InstanceState) -> None:
        key = value.instance.encode()
        raw = value.model_dump_json().encode()
        if len(raw) + len(key) > self.max_bytes:
            raise BadRecord(
                "too_large",
                f"the state of {value.instance} would be {len(raw)} bytes; a changelog "
                f"record takes at most {self.max_bytes} (settings.max_output_bytes)",
            )
        if _finished(value):  # it leaves memory now, not at the end of its retention
            self._raw[value.instance] = zlib.compress(raw, 1)
            self._parsed.pop(value.instance, None)
        else:
            self._raw[value.instance] = raw
            self._parsed[value.instance] = value.model_copy(deep=True)
        self._queued.append(
            OutRecord(self.topic, key, raw, None, self.partition, seq=next_change())
        )

    def delete(self, instance: str) -> None:
        if self._raw.pop(instance, None) is not None:
            self._parsed.pop(instance, None)
            # An empty value: the unit sends it as null, a tombstone.
            tombstone = OutRecord(
                self.topic, instance.encode(), b"", None, self.partition, seq=next_change()
            )
            self._queued.append(tombstone)

    def states(self) -> Iterator[InstanceState]:
        for instance in list(self._raw):
            found = self.get(instance)
            if found is not None:
                yield found

    def take(self) -> list[OutRecord]:
        """The changelog records of the changes since the last take."""
        taken, self._queued = self._queued, []
        return taken


class Stores:
    """The stores of the units this process owns, as one `StateStore` for the workflow:
    an instance lives in the store of its input's partition."""

    def __init__(self) -> None:
        self.by_partition: dict[int, UnitStore] = {}

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

    def put(self, value: InstanceState) -> None:
        store = self.by_partition.get(value.partition)
        if store is None:
            # Its partition moved away while the change was being made: the new owner
            # redoes it from the last commit; nothing is stored here.
            log.info(
                "state of %s not stored: partition %d is not owned here",
                value.instance,
                value.partition,
            )
            return
        store.put(value)

    def items(self) -> Iterator[InstanceState]:
        for store in list(self.by_partition.values()):
            yield from store.states()

    def delete(self, instance: str, partition: int) -> None:
        store = self.by_partition.get(partition)
        if store is not None:
            store.delete(instance)

    async def flush(self) -> None:
        """Nothing to wait for: changes become durable with their unit's transaction."""

    def take(self, partitions: Iterable[int] | None = None) -> dict[int, list[OutRecord]]:
        """Per partition, the changelog records queued since the last take."""
        chosen = (
            self.by_partition
            if partitions is None
            else {p: self.by_partition[p] for p in partitions if p in self.by_partition}
        )
        return {p: s.take() for p, s in chosen.items()}
