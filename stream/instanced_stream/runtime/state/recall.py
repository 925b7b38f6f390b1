"""The read-back of single changelog records, by offset: a finished workflow's state is
kept only on the changelog (the store remembers its offset and when it ended), and is read
back, rarely, when a repeated answer or a new input of its instance arrives.

A few read_committed consumers serve every partition of the process, each read one fetch
from the record's offset, so read-backs of different partitions go on side by side and a
slow changelog costs the partitions waiting on it, not the others. A record that is not
where the store says (it cannot be: compaction keeps a key's latest record, which the
store holds), does not come within the wait, or any error of the client, is an error its
caller's unit fails with, so the partition is reopened and restored, never decided on a
state that was not read and never a crash of the process. A reader that failed is
closed, not reused: a half-started or broken client leaves nothing open.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients

__all__ = ["READERS", "Recall", "RecallFailed"]

log = logging.getLogger("stream.store")

_WAIT_S = 10.0  # for one record: a broker that takes longer fails the unit instead
READERS = 4  # read-backs at once, each on a consumer of its own


class RecallFailed(StreamError):
    """A finished state could not be read back from the changelog."""


class Recall:
    def __init__(self, bootstrap: str, topic: str, readers: int = READERS) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.reads = 0  # records read back so far (a figure for the live page and tests)
        self._slots = asyncio.Semaphore(readers)
        self._idle: list[AIOKafkaConsumer] = []
        self._open: set[AIOKafkaConsumer] = set()

    async def read(self, partition: int, offset: int, key: str) -> bytes:
        """The value of the record of `key` at `offset` of changelog partition
        `partition`. Raises `RecallFailed`, or the client's error."""
        async with self._slots:
            consumer = self._idle.pop() if self._idle else await self._started()
            try:
                value = await asyncio.wait_for(
                    self._fetch(consumer, partition, offset, key), _WAIT_S + 1
                )
            except BaseException:
                await self._close(consumer)
                raise
            self._idle.append(consumer)
            self.reads += 1
            return value

    async def _fetch(
        self, consumer: AIOKafkaConsumer, partition: int, offset: int, key: str
    ) -> bytes:
        tp = TopicPartition(self.topic, partition)
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        consumer.seek(tp, offset)
        until = time.monotonic() + _WAIT_S
        while time.monotonic() < until:
            found = await consumer.getmany(tp, timeout_ms=500, max_records=8)
            for rec in found.get(tp, []):
                if rec.offset < offset:
                    continue
                if rec.offset != offset or rec.key != key.encode() or not rec.value:
                    raise RecallFailed(
                        f"changelog {self.topic}/{partition} holds no state of {key!r} "
                        f"at offset {offset}"
                    )
                value: bytes = rec.value
                return value
        raise RecallFailed(
            f"changelog {self.topic}/{partition}: the state of {key!r} at offset {offset} "
            f"was not read within {_WAIT_S:.0f} s"
        )

    async def _started(self) -> AIOKafkaConsumer:
        consumer = clients.consumer(self.bootstrap)
        self._open.add(consumer)
        try:
            await asyncio.wait_for(consumer.start(), _WAIT_S)
        except BaseException:
            await self._close(consumer)
            raise
        return consumer

    async def _close(self, consumer: AIOKafkaConsumer) -> None:
        self._open.discard(consumer)
        try:
            await consumer.stop()
        except Exception as exc:  # a client that never connected may refuse to stop
            log.debug("read-back consumer stop: %r", exc)

    async def stop(self) -> None:
        self._idle = []
        for consumer in list(self._open):
            await self._close(consumer)
