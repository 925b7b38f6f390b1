"""The units' producers: with exactly once, one transactional producer per input
partition, its id stable per partition (`<app id>.<input topic>.<p>`), so starting it
fences the partition's earlier owner (docs/architecture.md); with at least once, one
shared idempotent producer. A producer renewed after a refusal keeps its unit's id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import record_limits
from instanced_stream.runtime.engine.opening import broken_producer
from instanced_stream.runtime.engine.unit import LINGER_S, CommitOffsets, Refusals, Replace, Unit

__all__ = ["Producers"]

log = logging.getLogger("stream.membership")

# A commit hands its whole prefix over at once: in large batches it goes out in one
# request per partition instead of one per 16 KB (an idempotent producer has one
# request in flight per partition, so small batches queue behind each other's acks).
_BATCHING: dict[str, int] = {
    "linger_ms": 0,
    "max_batch_size": 1024 * 1024,
    "max_request_size": 8 * 1024 * 1024,
}


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
        self._shared: Any = None  # at least once: one idempotent producer for all units

    async def start(self) -> None:
        if not self.transactional:
            self._shared = self.make(self.bootstrap, **self.batching)
            await self._shared.start()

    async def stop(self) -> None:
        if self._shared is not None:
            await self._shared.stop()

    async def unit(
        self, partition: int, commit_offsets: CommitOffsets, after: BaseException | None = None
    ) -> Unit:
        """The unit of `partition`, its producer started. At least once: the shared
        producer, and `commit_offsets` (the consumer's commit) after the sends. `after`:
        what the partition's last unit failed with; a shared producer it left broken is
        renewed first."""
        shared = not self.transactional
        if shared and broken_producer(after) and self._shared is not None:
            log.error("the shared producer is broken (%r): renewed", after)
            old, self._shared = self._shared, None
            await old.stop()
            await self.start()
        return Unit(
            partition,
            self._shared if shared else await self._producer(partition),
            group_id=self.group_id,
            transactional=self.transactional,
            commit_offsets=commit_offsets if shared else None,
            refusals=self._refusals(None if shared else partition),
            probe=self.probe,
            linger_s=self.commit_interval_s,
        )

    async def _producer(self, partition: int, max_batch: int | None = None) -> Any:
        batching = dict(self.batching)
        if max_batch is not None:
            batching["max_batch_size"] = max(1024, min(max_batch, batching["max_batch_size"]))
        tid = f"{self.prefix}.{partition}"
        producer = self.make(self.bootstrap, transactional_id=tid, **batching)
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

        async def renew(max_batch: int) -> Any:
            assert partition is not None
            return await self._producer(partition, max_batch)

        return Refusals(self.replace, limits, renew if partition is not None else None)
