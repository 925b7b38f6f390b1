"""Publishes records and waits for the broker's acknowledgement of every one.

A batch counts as published only when each of its sends is acknowledged (acks=all,
idempotent producer); a failed send is retried until it goes through, so a broker
restart delays a batch but never drops it. Retried sends carry the same `call_id`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner

from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.tracing import TRACES, Headers, TraceContext
from instanced_stream.retry import RetryPolicy

__all__ = [
    "FORWARDED_FROM",
    "REFUSALS",
    "PublishError",
    "Publisher",
    "forwarded",
    "forwarded_context",
    "forwarded_from",
    "home_partition",
]

log = logging.getLogger("stream.publish")

_BACKOFF = RetryPolicy(base_s=0.2, cap_s=10.0)  # unacknowledged publishes


# Errors about one record itself: retrying that record cannot help. Every other error
# (a broker down longer than the request timeout, a revoked ACL, an unknown topic) is about
# the cluster, and is retried until it heals: a batch waits, it is never dead-lettered.
REFUSALS = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    InvalidTopicError,
    CorruptRecordException,
)


_PARTITIONER = DefaultPartitioner()  # the producer's own choice for a keyed record


def home_partition(instance: str, partitions: int) -> int:
    """The partition of a stateful instance: where a record keyed by its id lands (every
    Kafka client's default partitioner, murmur2), so a producer keying by instance needs
    no forwarding."""
    every = list(range(partitions))
    return int(_PARTITIONER(instance.encode(), every, every))


# On a record sent on to its instance's partition: where it was first (topic/partition/
# offset). The audit takes the copy for the original, as a re-drive for its first attempt.
FORWARDED_FROM = "stream-forwarded-from"


def forwarded(
    origin: tuple[str, int, int], instance: str, value: bytes, partition: int, headers: Headers
) -> OutRecord:
    """A record of `instance` sent on to its home `partition` of the topic it came on,
    keyed by the instance so any later copy lands there directly."""
    topic, at, offset = origin
    kept = [(k, v) for k, v in headers if k != FORWARDED_FROM]
    mark = (FORWARDED_FROM, f"{topic}/{at}/{offset}".encode())
    return OutRecord(topic, instance.encode(), value, partition=partition, headers=(*kept, mark))


def forwarded_context(
    origin: tuple[str, int, int], topic: str, key: str, value: bytes, headers: Headers
) -> OutRecord:
    """A context message read on the input topic, sent on to the context `topic` (one
    partition) under `key`, marked with where it was first: the audit counts it as that
    input's outcome."""
    at, partition, offset = origin
    kept = [(k, v) for k, v in headers if k != FORWARDED_FROM]
    mark = (FORWARDED_FROM, f"{at}/{partition}/{offset}".encode())
    return OutRecord(topic, key.encode(), value, partition=0, headers=(*kept, mark))


def forwarded_from(headers: Iterable[tuple[str, bytes]] | None) -> tuple[str, int, int] | None:
    """Where a forwarded record was first, if it was forwarded."""
    for key, raw in headers or ():
        if key == FORWARDED_FROM:
            topic, _, offset = raw.decode("utf-8", "replace").rpartition("/")
            topic, _, partition = topic.rpartition("/")
            if topic and partition.isdigit() and offset.isdigit():
                return (topic, int(partition), int(offset))
    return None


class PublishError(StreamError):
    """The broker refused records for good (e.g. too large); every other record of the
    publish was acknowledged."""

    def __init__(self, message: str, refused: list[OutRecord]) -> None:
        super().__init__(message)
        self.refused = refused


class Publisher:
    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "stream-publisher",
        request_timeout_ms: int = 30_000,
        traces: TraceContext = TRACES,
    ) -> None:
        self._traces = traces
        self._bootstrap = bootstrap
        self._request_timeout_ms = request_timeout_ms
        self._client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self.sent = 0
        self.retries = 0

    async def start(self) -> None:
        # Created here, not in __init__: aiokafka binds to the loop that is running.
        self._producer = clients.producer(
            self._bootstrap,
            client_id=self._client_id,
            linger_ms=0,
            max_batch_size=1024 * 1024,
            max_request_size=8 * 1024 * 1024,
            request_timeout_ms=self._request_timeout_ms,
        )
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def _partition(self, rec: OutRecord, known: dict[str, list[int]]) -> int | None:
        """The record's partition, as the producer would choose it for its key (chosen
        here, once, so that its sends can be grouped by partition). `known`: the topics'
        partitions, looked up once per publish (ops may add partitions at any time)."""
        if rec.partition is not None or rec.key is None:
            return rec.partition
        assert self._producer is not None
        partitions = known.get(rec.topic)
        if partitions is None:
            found = await self._producer.partitions_for(rec.topic)
            partitions = known[rec.topic] = sorted(found)
        return int(_PARTITIONER(rec.key, partitions, partitions))

    async def publish(self, records: Sequence[OutRecord]) -> None:
        """Sends all records and returns once the broker acknowledged each of them."""
        assert self._producer is not None, "Publisher.start() was not awaited"
        todo = list(records)
        refused: list[tuple[OutRecord, BaseException]] = []
        attempt = 0
        while todo:
            futures: list[tuple[Any, asyncio.Future[Any]]] = []
            known: dict[str, list[int]] = {}
            for rec in todo:
                try:
                    partition = await self._partition(rec, known)
                    fut = await self._producer.send(
                        rec.topic,
                        rec.value,
                        key=rec.key,
                        partition=partition,
                        headers=list(self._traces.headers(rec.origin, rec.headers)) or None,
                    )
                except KafkaError as exc:
                    partition, fut = None, _failed(exc)
                futures.append(((rec.topic, partition) if partition is not None else fut, fut))
            outcomes = await _settled(futures)
            first = next((i for i, err in enumerate(outcomes) if err is not None), None)
            if first is None:
                self.sent += len(todo)
                break
            error = outcomes[first]
            if isinstance(error, REFUSALS):
                # That record is set aside; the rest go on, in order.
                refused.append((todo[first], error))
                self.sent += first
                todo = todo[first + 1 :]
                continue
            # Resend from the first failure on, so an instance's records keep their order.
            self.sent += first
            todo = todo[first:]
            attempt += 1
            self.retries += len(todo)
            delay = _BACKOFF.delay(attempt)
            log.warning(
                "%d publishes not acknowledged (%r); retrying in %.1fs", len(todo), error, delay
            )
            await asyncio.sleep(delay)
        if refused:
            rec, error = refused[0]
            raise PublishError(
                f"broker refused {len(refused)} records (first for {rec.topic}: {error!r})",
                [r for r, _ in refused],
            )


async def _settled(
    futures: list[tuple[Any, asyncio.Future[Any]]],
) -> list[BaseException | None]:
    """Each send's error, or None. The producer settles a partition's sends in the order
    they were made, a whole batch of them at once: waiting on the last send of each
    partition settles the rest, without a callback on every record's future (those were
    a tenth of the processor's time with a fast model)."""
    last = dict(futures)
    if last:
        await asyncio.wait(last.values())
    rest = [fut for _, fut in futures if not fut.done()]
    if rest:  # not expected (a retried batch of the partition is sent first): wait all
        await asyncio.wait(rest)
    return [fut.exception() for _, fut in futures]


def _failed(exc: BaseException) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut
