"""The read-back of single changelog records, by offset: a finished workflow's state is
kept only on the changelog (the store remembers its offset and when it ended), and is read
back, rarely, when a repeated answer or a new input of its instance arrives.

One consumer serves every partition of the process, read_committed, under a lock: a
read-back is one fetch from the record's offset. A record that is not where the store
says (it cannot be: compaction keeps a key's latest record, which the store holds) or
does not come within the wait is an error its caller's unit fails with, so the partition
is reopened and restored, never decided on a state that was not read.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients

__all__ = ["Recall", "RecallFailed"]

_WAIT_S = 10.0  # for one record: a broker that takes longer fails the unit instead


class RecallFailed(StreamError):
    """A finished state could not be read back from the changelog."""


class Recall:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.reads = 0  # records read back so far (a figure for the live page and tests)
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read(self, partition: int, offset: int, key: str) -> bytes:
        """The value of the record of `key` at `offset` of changelog partition
        `partition`."""
        tp = TopicPartition(self.topic, partition)
        async with self._lock:
            consumer = await self._started()
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
                    self.reads += 1
                    value: bytes = rec.value
                    return value
        raise RecallFailed(
            f"changelog {self.topic}/{partition}: the state of {key!r} at offset {offset} "
            f"was not read within {_WAIT_S:.0f} s"
        )

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = clients.consumer(self.bootstrap)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def stop(self) -> None:
        async with self._lock:
            if self._consumer is not None:
                await self._consumer.stop()
                self._consumer = None
