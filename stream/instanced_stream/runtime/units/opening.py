"""Opening a unit: the assigned input partitions whose unit does not take work yet, each
opened by a task of its own outside the assignment callback (its producer started, which
fences the partition's earlier owner; its store restored; its offsets sought), and
opened again after a back-off when that fails. One partition failing holds no other
back, and shows as failing in readiness, metrics and lag until it opens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidProducerEpoch,
    KafkaError,
    OutOfOrderSequenceNumber,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)

from instanced_stream.errors import StreamError
from instanced_stream.runtime.state.recall import RecallFailed
from instanced_stream.runtime.units.lifecycle import Lifecycle, Opening, UnitState
from instanced_stream.runtime.units.unit import Unit

__all__ = [
    "BROKER_PATIENCE_S",
    "MAX_FAILURES",
    "Failures",
    "Opening",
    "Openings",
    "PartitionFailing",
    "broken_producer",
    "fatal",
]

log = logging.getLogger("stream.membership")

MAX_FAILURES = 5  # a partition's failures in a row before the process stops
# How long the broker's own errors are waited out before they count too: an outage of
# the broker is not this process's to fix, but one that never ends must not be a loop
# nobody sees.
BROKER_PATIENCE_S = 120.0

# Broker errors no retry can mend: what this process may do is refused, or its topic is
# not there. Each counts at once.
_FATAL = (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)
# A producer in a state it cannot leave (a refused record left a gap in its sequence
# numbers, at least once): only a new producer sends again.
_BROKEN_PRODUCER = (OutOfOrderSequenceNumber, InvalidProducerEpoch)


def fatal(exc: BaseException | None) -> bool:
    return isinstance(exc, _FATAL)


def broken_producer(exc: BaseException | None) -> bool:
    return isinstance(exc, _BROKEN_PRODUCER)


class PartitionFailing(StreamError):
    """A partition's unit kept failing: its work cannot be delivered by this process."""


class Failures:
    """When a failed partition may be opened again: after a back-off that doubles with
    each failure in a row, up to 10 s. A failure counts, and a partition that fails
    `MAX_FAILURES` times in a row without a commit between stops the process
    (`PartitionFailing`): its prefix cannot be delivered here, and a restart (or another
    member) is the remedy an operator sees, rather than a silent loop that asks the model
    again and again. The broker's retriable errors (unreachable, timed out, fenced, a
    producer to renew) count only once the partition has failed for `BROKER_PATIENCE_S`;
    fatal ones (authorization, an unknown topic) count at once."""

    def __init__(self, patience_s: float = BROKER_PATIENCE_S) -> None:
        self.patience_s = patience_s
        self.by_partition: dict[int, int] = {}  # failures in a row that count
        self._tries: dict[int, int] = {}  # failures in a row, the broker's own included
        self._since: dict[int, float] = {}  # when the run of failures began

    def healthy(self, p: int, unit: Unit) -> None:
        """A unit that committed since its last failure starts the count again."""
        if unit.held and unit.commits:
            self.forget(p)

    def failed(self, p: int, exc: BaseException | None, now: float) -> float:
        """Counts a failure of partition `p`; returns when to open it again."""
        tries = self._tries[p] = self._tries.get(p, 0) + 1
        since = self._since.setdefault(p, now)
        # A read-back that failed is the changelog's broker too (runtime/state/recall.py).
        brokers = isinstance(exc, KafkaError | RecallFailed) and not fatal(exc)
        if fatal(exc):
            log.error("partition %d: the broker refuses for good: %r", p, exc)
        if not brokers or now - since >= self.patience_s:
            count = self.by_partition[p] = self.by_partition.get(p, 0) + 1
            if count >= MAX_FAILURES:
                raise PartitionFailing(
                    f"partition {p} failed {count} times in a row ({now - since:.0f}s): {exc!r}"
                )
        return now + min(0.5 * 2.0 ** min(tries - 1, 5), 10.0)

    def forget(self, p: int) -> None:
        """The partition committed, or moved away: its count starts again."""
        self.by_partition.pop(p, None)
        self._tries.pop(p, None)
        self._since.pop(p, None)


class Openings:
    """Opens units, each in a task of its own, keeping each partition's state in
    `lifecycle`. `open`: opens the unit of an `Opening` (setting its `unit` once its
    producer is up); `opened`: takes an open unit into service; `close`: closes a unit
    that never served; `on_failed`: told each failure; `progress`: records restored so
    far."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        open: Callable[[Opening], Awaitable[Unit]],
        opened: Callable[[Unit], None],
        close: Callable[[Unit], Awaitable[None]],
        on_failed: Callable[[int, BaseException], None],
        progress: Callable[[int], int],
    ) -> None:
        self.lifecycle = lifecycle
        self.open, self.opened, self.close = open, opened, close
        self.on_failed, self.progress = on_failed, progress
        self.by_partition = lifecycle.opening  # a view: RESTORING and FAILED
        self.failures = Failures()
        self.fatal: PartitionFailing | None = None  # raised by the next `retry`
        self.stopping = False

    def begin(self, opening: Opening, epoch: int) -> None:
        """Opens `opening`'s partition, newly assigned (or failed before) under `epoch`."""
        p = opening.partition
        if self.lifecycle.state(p) is None:
            self.lifecycle.move(p, UnitState.ASSIGNED, epoch=epoch)
        self.lifecycle.move(p, UnitState.RESTORING, opening=opening, unit=None, epoch=epoch)
        opening.task = asyncio.create_task(self._run(opening), name=f"open-{p}")

    def failing(self, p: int, exc: BaseException | None) -> None:
        """A unit of `p` that failed while it served: opened again after its back-off."""
        failed = exc or RuntimeError("unit failed")
        opening = Opening(p, failed=failed)
        self.lifecycle.move(p, UnitState.FAILED, opening=opening, unit=None)
        self._failed(opening, failed)

    async def cancel(self, partitions: list[int]) -> None:
        """Stops opening `partitions` (restoring, failed or suspended while restoring);
        a producer already started is closed; they are closed in the lifecycle before the
        first wait: whatever resumes meanwhile finds them gone."""
        stopped = []
        for p in partitions:
            task = self.lifecycle.get(p)
            if task is not None and task.opening is not None:
                stopped.append(task.opening)
                self.lifecycle.move(p, UnitState.CLOSED, opening=None)
        for opening in stopped:
            if opening.task is not None:
                opening.task.cancel()
                await asyncio.gather(opening.task, return_exceptions=True)
            if opening.unit is not None:
                await self.close(opening.unit)
                opening.unit = None

    def _current(self, opening: Opening) -> bool:
        task = self.lifecycle.get(opening.partition)
        return task is not None and task.opening is opening

    async def _run(self, opening: Opening) -> None:
        p = opening.partition
        opening.since = time.monotonic()
        try:
            unit = await self.open(opening)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            half, opening.unit = opening.unit, None
            if half is not None:
                await self.close(half)
            opening.task = None
            if self._current(opening) and not self.stopping:
                if self.lifecycle.state(p) is UnitState.SUSPENDED:
                    opening.failed = exc  # failed while revoked: the assignment decides
                    opening.retry_at = 0.0
                else:
                    self.lifecycle.move(p, UnitState.FAILED)
                    self._failed(opening, exc)
            log.warning(
                "partition %d: its unit did not open (%r); tried again in %.1fs",
                p,
                exc,
                max(0.0, opening.retry_at - time.monotonic()),
            )
            return
        if not self._current(opening) or self.stopping:
            await self.close(unit)  # closed, or the processor stops, meanwhile
            return
        opening.task = opening.unit = None
        self.lifecycle.move(p, UnitState.RUNNING, unit=unit, opening=None)
        self.opened(unit)
        log.info("partition %d: unit open in %.1fs", p, time.monotonic() - opening.since)

    def _failed(self, opening: Opening, exc: BaseException) -> None:
        opening.failures += 1
        opening.failed = exc
        self.on_failed(opening.partition, exc)
        try:
            opening.retry_at = self.failures.failed(opening.partition, exc, time.monotonic())
        except PartitionFailing as stop:
            opening.retry_at = float("inf")
            self.fatal = stop

    def retry(self) -> None:
        """Opens again each failed partition whose back-off is over; raises
        `PartitionFailing` for one that kept failing."""
        if self.fatal is not None:
            raise self.fatal
        now = time.monotonic()
        for task in self.lifecycle.in_state(UnitState.FAILED):
            opening = task.opening
            if opening is not None and not self.stopping and now >= opening.retry_at:
                self.begin(opening, task.epoch)

    def states(self) -> dict[int, dict[str, Any]]:
        """Per partition held here, what readiness shows: `open` (its unit serves),
        what `Opening.view` says (restoring, failing), or `suspended`."""
        now = time.monotonic()
        out: dict[int, dict[str, Any]] = {}
        for task in self.lifecycle.in_state(*UnitState):
            if task.state is UnitState.RUNNING:
                out[task.partition] = {"state": "open"}
            elif task.opening is not None and task.state is not UnitState.SUSPENDED:
                out[task.partition] = task.opening.view(now, self.progress(task.partition))
            else:
                out[task.partition] = {"state": task.state.value}
        return out
