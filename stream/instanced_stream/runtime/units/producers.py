"""The units' producers: with exactly once, one transactional producer per input
partition, its id stable per partition (`<app id>.<input topic>.<p>`), so starting it
fences the partition's earlier owner (docs/architecture.md); with at least once, one
shared idempotent producer. A producer renewed after a refusal keeps its unit's id.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import record_limits
from instanced_stream.runtime.units.collector import Refusals, Replace
from instanced_stream.runtime.units.opening import broken_producer
from instanced_stream.runtime.units.unit import LINGER_S, CommitOffsets, Owner, Unit

__all__ = ["Producers", "SharedProducer"]

log = logging.getLogger("stream.membership")

# A commit hands its whole prefix over at once: in large batches it goes out in one
# request per partition instead of one per 16 KB (an idempotent producer has one
# request in flight per partition, so small batches queue behind each other's acks).
_BATCHING: dict[str, int] = {
    "linger_ms": 0,
    "max_batch_size": 1024 * 1024,
    "max_request_size": 8 * 1024 * 1024,
}


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
                unit.collector.renewed(broken, self.producer)
            log.warning("at least once: a refused record; the shared producer is renewed")
        try:  # its sends in flight end first; a unit whose send fails then is reopened
            await broken.stop()
        except Exception as exc:
            log.debug("the broken shared producer's stop: %r", exc)
        return self.producer

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()


class Producers:
    """Makes units with their producers. `make`: the producer factory
    (`clients.producer`); `replace`: a refused record's replacement (`Refusals`)."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        *,
        transactional: bool,
        transactional_prefix: str,
        request_timeout_ms: int = 30_000,
        replace: Replace | None = None,
        probe: Probe = NO_PROBE,
        commit_interval_s: float = LINGER_S,
        make: Callable[..., Any] = clients.producer,
    ) -> None:
        self.bootstrap, self.group_id = bootstrap, group_id
        self.transactional, self.prefix = transactional, transactional_prefix
        self.batching = {**_BATCHING, "request_timeout_ms": request_timeout_ms}
        self.replace, self.probe, self.commit_interval_s = replace, probe, commit_interval_s
        self.make = make
        # The open units, whose producers a renewal swaps: Membership sets its view here.
        self.owned: Mapping[int, Unit] = {}
        # At least once: one idempotent producer for all units.
        self._shared = SharedProducer(functools.partial(self._producer, None))

    async def start(self) -> None:
        if not self.transactional:
            await self._shared.start()

    async def stop(self) -> None:
        await self._shared.stop()

    async def unit(
        self,
        partition: int,
        commit_offsets: CommitOffsets,
        after: BaseException | None = None,
        *,
        owner: Owner | None = None,
    ) -> Unit:
        """The unit of `partition`, its producer started. At least once: the shared
        producer, and `commit_offsets` (the consumer's commit) after the sends. `after`:
        what the partition's last unit failed with; a shared producer it left broken is
        renewed first."""
        shared = not self.transactional
        if shared and broken_producer(after):
            log.error("the shared producer is broken (%r): renewed", after)
            batch = self.batching["max_batch_size"]
            await self._shared.renew(self._shared.producer, batch, self.owned.values())
        return Unit(
            partition,
            self._shared.producer if shared else await self._producer(partition),
            group_id=self.group_id,
            transactional=self.transactional,
            commit_offsets=commit_offsets if shared else None,
            refusals=self._refusals(None if shared else partition),
            probe=self.probe,
            linger_s=self.commit_interval_s,
            owner=owner,
        )

    async def _producer(self, partition: int | None, max_batch: int | None = None) -> Any:
        """Partition p's transactional producer, or (None) the shared idempotent one."""
        batching = dict(self.batching)
        if max_batch is not None:
            batching["max_batch_size"] = max(1024, min(max_batch, batching["max_batch_size"]))
        ids = {} if partition is None else {"transactional_id": f"{self.prefix}.{partition}"}
        producer = self.make(self.bootstrap, **ids, **batching)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()  # a half-started producer holds its connections
            raise
        return producer

    def _refusals(self, partition: int | None) -> Refusals | None:
        if self.replace is None:
            return None

        async def limits(topics: set[str]) -> dict[str, int]:
            return await record_limits(self.bootstrap, topics)

        async def renew(broken: Any, max_batch: int) -> Any:
            if partition is None:
                return await self._shared.renew(broken, max_batch, self.owned.values())
            await broken.stop()  # before its successor fences it
            return await self._producer(partition, max_batch)

        return Refusals(self.replace, limits, renew)
