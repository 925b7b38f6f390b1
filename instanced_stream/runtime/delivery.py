"""Delivery: a batch's records to the broker, then its offsets to the ledger.

A batch is finished only when every record of it was acknowledged (or, when the broker
refuses them for good, its items were dead-lettered instead). An unexpected error is
retried; after the last try the items are dead-lettered with it; and should even that
fail, the worker is stopped (`fatal`), because a batch that ends unseen would hold its
partitions' commits forever while the worker looked healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from instanced_stream.core.instance import Instance
from instanced_stream.ops.metrics import Metrics
from instanced_stream.retry import RetryPolicy
from instanced_stream.runtime.offsets import Entry, OffsetLedger
from instanced_stream.runtime.probe import Probe
from instanced_stream.runtime.publish import Order, OutRecord, PublishError
from instanced_stream.runtime.records import Planned, RecordBuilder, TurnChange, oversized, position

__all__ = ["BATCH_TRIES", "Delivery", "Fatal", "Keeper", "Sink", "retried"]

log = logging.getLogger("stream.processor")

_BACKOFF = RetryPolicy(base_s=0.5, cap_s=5.0)  # a batch's delivery that raised

_T = TypeVar("_T")

BATCH_TRIES = 3

Fatal = Callable[[BaseException], Awaitable[None]]


class Keeper(Protocol):
    """Where a batch's turns are kept (the workflow coordinator)."""

    def store(self, turns: list[TurnChange], records: list[OutRecord]) -> None: ...

    async def flush(self) -> None: ...

    def paid(self, turns: list[TurnChange]) -> None: ...


class Sink(Protocol):
    """Where records go: `publish` returns once the broker acknowledged every one."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, records: list[OutRecord], sent: Order | None = None) -> None: ...


async def retried(batch_id: str, what: str, step: Callable[[], Awaitable[_T]]) -> _T | Exception:
    """Runs `step` up to BATCH_TRIES times; its result, or the last error. A bug must cost
    a retry, never an item: the caller dead-letters with the error."""
    error: Exception = RuntimeError(f"{what} was not tried")
    for attempt in range(1, BATCH_TRIES + 1):
        try:
            return await step()
        except Exception as exc:
            log.exception(
                "batch %s: %s failed (try %d of %d)",
                batch_id,
                what,
                attempt,
                BATCH_TRIES,
                extra={"batch_id": batch_id},
            )
            error = exc
            await asyncio.sleep(_BACKOFF.delay(attempt))
    return error


class Delivery:
    def __init__(
        self,
        sink: Sink,
        builder: RecordBuilder,
        metrics: Metrics,
        ledger: OffsetLedger,
        probe: Probe,
        on_fatal: Fatal | None = None,
        max_output_bytes: int = 1_000_000,
    ) -> None:
        self.sink = sink
        self.builder = builder
        self.metrics = metrics
        self.ledger = ledger
        self.probe = probe
        self.max_output_bytes = max_output_bytes
        # Stops the worker so the group redelivers; None: the error is raised instead.
        self.on_fatal = on_fatal

    async def publish(self, planned: Planned) -> None:
        """Counts what the records mean, then publishes them."""
        self.count(planned)
        await self.sink.publish(planned.records)

    def count(self, planned: Planned) -> None:
        self.metrics.count(planned.events)
        self.metrics.decisions.extend(planned.decisions)

    async def deliver(
        self,
        batch_id: str,
        instances: list[Instance],
        entries: Sequence[Entry | None],
        planned: Planned,
        keeper: Keeper,
        order: Order | None = None,
    ) -> None:
        """Stores a batch's turns (with the records they owe), publishes its records, then
        finishes its offsets. Turns first: a result can come back before the whole batch
        is published, and must find its call pending (instanced_stream/runtime/coordinator.py).
        `order`: the batch's place among the publishes (instanced_stream/runtime/publish.py)."""
        self.count(planned)

        async def publish() -> None:
            self.probe.at("after_llm")
            # Items of partitions revoked meanwhile are being redone by their new owner.
            gone = {(e.tp[0], e.tp[1], e.offset) for e in entries if e and e.dropped}
            turns = [t for t in planned.turns if position(t.instance.source) not in gone]
            records = [r for r in planned.records if r.origin not in gone]
            keeper.store(turns, records)
            await keeper.flush()
            self.probe.at("after_state")  # state durable, its records not yet published
            await self._publish_or_dead_letter(batch_id, instances, records, order)
            keeper.paid(turns)
            self.probe.at("after_publish")  # published, offsets not yet finished

        error = await retried(batch_id, "delivering", publish)
        if isinstance(error, Exception):
            failed = self.builder.internal_errors(batch_id, instances, error, BATCH_TRIES)
            keeper.store(failed.turns, [])
            await self.publish(failed)
        await keeper.flush()
        for entry in entries:
            if entry is not None:
                self.ledger.finish(entry)

    async def _publish_or_dead_letter(
        self,
        batch_id: str,
        instances: list[Instance],
        records: list[OutRecord],
        order: Order | None,
    ) -> None:
        """Publishes; a record too large for the broker (checked before it is sent) or
        refused by it is replaced by a dead letter for its item, and its batch-mates go on."""
        fits = [r for r in records if _size(r) <= self.max_output_bytes]
        refused = [(r, "") for r in records if _size(r) > self.max_output_bytes]
        try:
            await self.sink.publish(fits, order)
        except PublishError as exc:
            log.error("batch %s: %s", batch_id, exc.message, extra={"batch_id": batch_id})
            refused += [(r, exc.message) for r in exc.refused]
        if refused:
            by_origin = {position(i.source): i for i in instances}
            letters = Planned()
            for rec, said in refused:
                owner = by_origin.get(rec.origin) if rec.origin else None
                letter = oversized(rec, owner, self.max_output_bytes, batch_id, said)
                letters.add(self.builder.letter(letter))
            await self.publish(letters)

    async def fatal(self, batch_id: str, exc: Exception) -> None:
        """Every fallback failed: stop the worker; the group redoes the batch from the
        last commit."""
        log.critical(
            "batch %s could not be delivered, stopping the worker: %r",
            batch_id,
            exc,
            extra={"batch_id": batch_id},
        )
        if self.on_fatal is None:
            raise exc
        await self.on_fatal(exc)


def _size(record: OutRecord) -> int:
    return len(record.value) + len(record.key or b"")
