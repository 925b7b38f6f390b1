"""The changelog reader of one unit's store: reads partition p of the compacted changelog,
read_committed, from where the store left it to its last stable offset, and sets aside
each record it cannot parse (`Quarantined`) so the partition opens without it
(docs/architecture.md, exactly once).

The store (`store.UnitStore`) owns the states; this reader owns how far the partition was
read (`applied`, `restored`) and the unreadable records until they are staged: each is
staged once, with its key's tombstone, in the unit's first commit after the restore, and
set aside again by a later restore that does not read that tombstone back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Container
from dataclasses import dataclass

from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from instanced_stream.core.state import InstanceState
from instanced_stream.kafka import clients

__all__ = ["AT_ONCE", "ChangelogReader", "Quarantined"]

log = logging.getLogger("stream.store")

# The restores' turns, one rule in two numbers. Records past which a read waits for its
# turn (the gate `Restores` holds): a few large restores at once, each holding its
# records until parsed; a small one (a fresh or quiet partition, a delta) starts at once,
# as its time is the broker's round trips, not the parsing.
_LARGE = 2_000
# Large reads at once (the gate's size). A restore holds its partition's latest records
# (about 3 KB a state) until it has parsed them, and parsing takes the one event loop:
# more at once would finish none sooner, and would hold every partition's records
# together (24 partitions of 100,000 states: 290 MB).
AT_ONCE = 4


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A changelog record the store could not read: where it is, and why."""

    key: str
    partition: int
    offset: int
    value: bytes
    reason: str


class ChangelogReader:
    """Reads one changelog partition into latest records per key, and quarantines the
    records that do not parse as a state."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        # The changelog offset up to which the store has applied the partition (the next
        # offset to read): a later restore reads only what came after it.
        self.applied = 0
        self.restored = 0  # records read by the restore in progress (its progress)
        self.quarantined: list[Quarantined] = []  # unreadable records, not yet staged
        self._staged: list[Quarantined] = []  # staged, their tombstones not yet read back

    def rewind(self) -> None:
        """The next read starts at the partition's beginning (its store dropped what it
        had applied)."""
        self.applied = 0

    async def read(
        self, bootstrap: str, gate: asyncio.Semaphore | None, gated: contextlib.AsyncExitStack
    ) -> dict[str, tuple[int, bytes | None]]:
        """Each key's latest record (offset, value; None: a tombstone) after `applied`. A
        read of more than `_LARGE` records enters `gate` on `gated`: it holds it until
        its caller has parsed them."""
        tp = TopicPartition(self.topic, self.partition)
        latest: dict[str, tuple[int, bytes | None]] = {}
        self.restored = 0
        consumer = clients.consumer(bootstrap)
        await consumer.start()
        try:
            consumer.assign([tp])
            start = (await consumer.beginning_offsets([tp]))[tp]
            consumer.seek(tp, max(start, self.applied))
            end = (await consumer.end_offsets([tp]))[tp]
            if gate is not None and end - await consumer.position(tp) > _LARGE:
                await gated.enter_async_context(gate)
            while await consumer.position(tp) < end:
                found = await consumer.getmany(tp, timeout_ms=1000)
                for rec in found.get(tp, []):
                    if rec.key:
                        latest[rec.key.decode(errors="replace")] = (rec.offset, rec.value or None)
                    self.restored += 1
            self.applied = max(self.applied, end)
        finally:
            await consumer.stop()
        return latest

    def requarantine(self, read: Container[str]) -> None:
        """Records staged before whose key this read did not change (their tombstone was
        not committed): quarantined again."""
        for bad in self._staged:
            if bad.key not in read:
                self.quarantined.append(bad)
        self._staged = []

    def parse(self, key: str, offset: int, raw: bytes) -> InstanceState | None:
        """The state in `raw`, or None when it cannot be read: then it is quarantined."""
        try:
            return InstanceState.model_validate_json(raw)
        except ValidationError as exc:
            reason = f"unreadable state record: {exc.errors()[0]['msg']}"[:500]
            log.error(
                "partition %d: changelog record of %r at offset %d quarantined: %s",
                self.partition,
                key,
                offset,
                reason,
            )
            self.quarantined.append(Quarantined(key, self.partition, offset, raw, reason))
            return None

    def take(self) -> list[Quarantined]:
        """The unreadable records found so far, each taken once to be staged."""
        taken, self.quarantined = self.quarantined, []
        self._staged += taken
        return taken
