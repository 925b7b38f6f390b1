"""The record collector of one unit: sends the records of a commit through the unit's
producer and returns where each one was written, replaces a record the broker refuses
for itself with its item's dead letter, and renews the producer such a refusal broke.

It owns the unit's producer (the unit begins, commits and aborts its transactions on it:
`unit.Unit`, docs/architecture.md, exactly once); a renewal is the only change of it. A
refused batch's sequence numbers are never taken back (aiokafka), so its producer's next
send to that partition fails with OutOfOrderSequenceNumber: exactly once, a new producer
with the unit's transactional id; at least once, a new shared producer for every unit
(`producers.SharedProducer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from instanced_stream.kafka.publish import REFUSALS
from instanced_stream.kafka.records import OutRecord

__all__ = ["Limits", "RecordCollector", "Refusals", "Refused", "Renew", "Replace"]

log = logging.getLogger("stream.unit")

# A record the broker refuses for itself, the replacement to write instead (its item's
# dead letter), given the broker's words.
Replace = Callable[[OutRecord, str], list[OutRecord]]
# Each topic's record limit as the broker holds it now (`max.message.bytes`).
Limits = Callable[[set[str]], Awaitable[dict[str, int]]]
# A fresh producer for the unit in place of the one a refusal left broken (which the
# renewer stops), given the largest record batch the topics take (so that a batch of
# small records is not refused as a whole).
Renew = Callable[[AIOKafkaProducer, int], Awaitable[AIOKafkaProducer]]

# What a record batch adds to its one record (headers of the batch and the record).
_BATCH_OVERHEAD = 128


@dataclass(frozen=True, slots=True)
class Refusals:
    """How a unit handles records the broker refuses for themselves."""

    replace: Replace
    limits: Limits
    renew: Renew | None = None


class Refused(Exception):
    """Records of one send the broker refused for themselves, by their place in it."""

    def __init__(self, refused: dict[int, BaseException]) -> None:
        super().__init__(f"{len(refused)} records refused")
        self.refused = refused


class RecordCollector:
    """Sends one unit's records and handles the ones the broker refuses (`refusals`;
    None: a refusal is raised as it is)."""

    def __init__(
        self, partition: int, producer: AIOKafkaProducer, refusals: Refusals | None = None
    ) -> None:
        self.partition = partition
        self.producer = producer
        self.refusals = refusals

    async def send(self, records: list[OutRecord]) -> list[int]:
        """Sends the records; returns each one's offset. Raises `Refused` when the broker
        refused some for themselves, and what any other send failed with."""
        # Every send is acknowledged before the commit: the transaction (or the consumer's
        # offset commit) must not be written ahead of the records it vouches for.
        # An empty value is a deletion (every output is JSON): sent as null, the tombstone
        # compaction removes.
        futures = [
            await self.producer.send(
                r.topic, r.value or None, key=r.key, partition=r.partition, headers=list(r.headers)
            )
            for r in records
        ]
        if not futures:
            return []
        return _offsets(await asyncio.gather(*futures, return_exceptions=True))

    async def replaced(self, records: list[OutRecord], exc: Refused) -> list[OutRecord]:
        """The records with each one over its topic's limit replaced, and the producer the
        refusal broke renewed with batches under the limit; raises when nothing can change."""
        renew = self.refusals.renew if self.refusals else None
        out, limits = await _without_refused(records, exc, self.refusals, self.partition)
        if out is records and (renew is None or not limits):
            raise next(iter(exc.refused.values())) from exc
        if renew is not None:
            self.producer = await renew(self.producer, _largest_batch(limits))
        return out

    def renewed(self, broken: AIOKafkaProducer, fresh: AIOKafkaProducer) -> None:
        """The shared producer `broken` was renewed for every unit (at least once): this
        collector sends through `fresh` if it sent through `broken`."""
        if self.producer is broken:
            self.producer = fresh


def _offsets(outcomes: list[Any]) -> list[int]:
    """Each send's offset; raises what the sends failed with (`Refused`: the records the
    broker refused for themselves)."""
    refused = {k: e for k, e in enumerate(outcomes) if isinstance(e, REFUSALS)}
    if refused:
        raise Refused(refused)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [outcome.offset for outcome in outcomes]


def _largest_batch(limits: dict[str, int]) -> int:
    """The largest record batch every topic of `limits` takes."""
    return min(limits.values(), default=1 << 20) - _BATCH_OVERHEAD


async def _without_refused(
    records: list[OutRecord], exc: Refused, refusals: Refusals | None, partition: int
) -> tuple[list[OutRecord], dict[str, int]]:
    """`records` with each refused one that is over its topic's current limit replaced by
    its item's dead letter (the same list when none is), and the limits looked up."""
    if refusals is None:
        return records, {}
    limits = await refusals.limits({records[k].topic for k in exc.refused})
    out: list[OutRecord] = []
    replaced = 0
    for k, rec in enumerate(records):
        limit = limits.get(rec.topic)
        size = len(rec.value) + len(rec.key or b"") + _BATCH_OVERHEAD
        if k not in exc.refused or limit is None or size <= limit:
            out.append(rec)
            continue
        replaced += 1
        log.error(
            "partition %d: the broker refused a record of %d bytes for %s (its limit: %d); "
            "its item is dead-lettered",
            partition,
            size,
            rec.topic,
            limit,
        )
        out += refusals.replace(rec, f"{exc.refused[k]!r}, max.message.bytes {limit}")
    return (out if replaced else records), limits
