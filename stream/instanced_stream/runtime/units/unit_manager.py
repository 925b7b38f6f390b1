"""The units' manager: it drives each assigned partition's lifecycle
(runtime/units/lifecycle.py) and owns every unit (`Owner`, runtime/units/unit.py). A
unit is opened by a task of its own (`Openings`): its producer first (with exactly once,
that fences the partition's earlier owner and settles its open transaction), then its
store restored (`on_open`), then the consumer sought to the committed offsets, read only
now that no earlier transaction can still move them, and the partition resumed. A unit
that fails tells its owner, this manager, which moves its partition at once
(`UnitManager.failed`): running, to FAILED, closed and opened again after a back-off
(`heal`); suspended, to CLOSED. Whoever stages on it from then on gets `UnitGone`.
Whether a unit serves is the lifecycle's answer (`Lifecycle.holds`), kept nowhere else.
What the group assigns and revokes is the rebalance listener's (runtime/units/
rebalance.py), which asks this manager to suspend, resume, close and open.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.runtime.units.lifecycle import Lifecycle, Opening, UnitState
from instanced_stream.runtime.units.opening import Openings
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit import Unit

__all__ = ["OnOpen", "UnitManager"]

log = logging.getLogger("stream.membership")

OnOpen = Callable[[Unit], Awaitable[None]]


class UnitManager:
    """The units of the partitions given to this member. `topics`: the input topic
    first, then the co-partitioned ones. `units`: the running ones (a view of the
    lifecycle, which the fetcher and the producers' renewal read); `opening`: the ones
    being opened or waiting to be opened again. `next`: per partition, the offset it
    owes next (the fetcher's; seeking writes it). `on_failed`: told each failure;
    `progress`: records restored so far."""

    def __init__(
        self,
        topics: list[str],
        producers: Producers,
        next: dict[TopicPartition, int],
        *,
        on_open: OnOpen | None = None,
        on_close: Callable[[Unit], None] | None = None,
        on_failed: Callable[[int, BaseException], None] = lambda _p, _e: None,
        progress: Callable[[int], int] = lambda _p: 0,
    ) -> None:
        self.producers = producers
        # Each partition's one state; `units` and `opening` are views of it.
        self.lifecycle = Lifecycle()
        self.units = producers.owned = self.lifecycle.running
        self.topics = topics
        self.on_open, self.on_close = on_open, on_close
        abandon = functools.partial(self.close, commit=False)  # a unit that never served
        self.openings = Openings(
            self.lifecycle, self._open, self._opened, abandon, on_failed, progress
        )
        self.opening = self.lifecycle.opening
        self._failures = self.openings.failures
        self.next = next
        self.consumer: AIOKafkaConsumer | None = None
        self._closing: set[asyncio.Task[None]] = set()  # failed units being closed

    async def closing(self) -> None:
        """Returns once every failed unit being closed is."""
        await asyncio.gather(*self._closing, return_exceptions=True)

    def suspend(self, partitions: list[int]) -> list[Unit]:
        """Suspends these partitions (revoked): a restore under way goes on, a running
        unit is kept. Returns the units that were running, whose finished prefix the
        caller commits. Moved before any wait: `heal` or an opening finishing meanwhile
        finds them suspended, never half there."""
        running = []
        for p in partitions:
            task = self.lifecycle.get(p)
            if task is None or task.state is UnitState.SUSPENDED:
                continue
            if task.state is UnitState.RUNNING and task.unit is not None:
                running.append(task.unit)
            self.lifecycle.move(p, UnitState.SUSPENDED)  # an opening seeks nothing now
        return running

    def keep_positions(self, mine: set[int]) -> None:
        """Forgets where the partitions not assigned here any more were read to."""
        for tp in [tp for tp in self.next if tp.partition not in mine]:
            del self.next[tp]

    def begin(self, partitions: list[int], epoch: int) -> None:
        """Starts opening newly assigned partitions, paused until their unit is sought."""
        if partitions:
            self.pause(partitions)
            for p in partitions:
                self.openings.begin(Opening(p), epoch)

    async def close_all(self, *, commit: bool) -> None:
        held = self.lifecycle.in_state(*UnitState)
        await self.openings.cancel([t.partition for t in held if t.opening is not None])
        for task in self.lifecycle.in_state(UnitState.RUNNING, UnitState.SUSPENDED):
            unit, running = task.unit, task.state is UnitState.RUNNING
            if unit is not None and commit and running:
                # Committed while its partition still holds it (a suspended one committed
                # when it was suspended); what comes meanwhile is redone by the next owner.
                await self._last_commit(unit)
            if self.lifecycle.get(task.partition) is not task or task.unit is not unit:
                continue  # it failed meanwhile: `failed` moved it and closes the unit
            self.lifecycle.move(task.partition, UnitState.CLOSED, unit=None)
            if unit is not None:
                await self.close(unit, commit=False)

    @staticmethod
    async def _last_commit(unit: Unit) -> None:
        try:
            await unit.commit()
        except Exception as exc:
            log.warning("partition %d: last commit failed: %r", unit.partition, exc)

    async def settle(self, mine: set[int], epoch: int) -> tuple[list[int], list[int], list[int]]:
        """Each suspended partition: resumed where it was if it is assigned here again
        under the epoch after its own (nobody else can have held it in between), else
        closed (what it had not committed is its next owner's, or this member's anew)."""
        resumed: list[int] = []
        restoring: list[int] = []
        closed: list[int] = []
        for task in self.lifecycle.in_state(UnitState.SUSPENDED):
            p, unit, opening = task.partition, task.unit, task.opening
            stays = p in mine and epoch == task.epoch + 1
            if stays and unit is not None:  # a suspended unit that failed was closed then
                self.lifecycle.move(p, UnitState.RUNNING, epoch=epoch)
                self.resumed(unit)
                resumed.append(p)
            elif stays and opening is not None and opening.task is not None:
                self.lifecycle.move(p, UnitState.RESTORING, epoch=epoch)  # it seeks now
                restoring.append(p)
            else:
                if opening is not None:
                    await self.openings.cancel([p])
                else:
                    self.lifecycle.move(p, UnitState.CLOSED, unit=None)
                    if unit is not None:
                        self._failures.forget(p)
                        await self.close(unit, commit=False)  # committed when suspended
                closed.append(p)
        return resumed, restoring, closed

    def resumed(self, unit: Unit) -> None:
        """A suspended unit takes work again where it was: each of its topics is read on
        from the record after the last one it tracked (what it had in flight stays in
        flight), not from the committed offsets."""
        assert self.consumer is not None
        for tp in self._tps([unit.partition]):
            if tp in self.next:
                self.consumer.seek(tp, self.next[tp])

    async def _open(self, opening: Opening) -> Unit:
        """The unit of one partition: its producer first (fencing), its store
        (`on_open`), then, once the partition is assigned here (not suspended), the
        consumer sought to the committed offsets of its topics."""
        p, after = opening.partition, opening.failed
        unit = opening.unit = await self.producers.unit(p, self._commit, after, owner=self)
        if self.on_open is not None:
            await self.on_open(unit)
        await self.lifecycle.unsuspended(p)
        await self._seek([opening.partition])
        return unit

    def _opened(self, unit: Unit) -> None:
        unit.start()
        self._resume([unit.partition])

    def holds(self, unit: Unit) -> bool:
        """Whether `unit` serves its partition here (`Owner`): the lifecycle's answer."""
        return self.lifecycle.holds(unit)

    def closed(self, unit: Unit) -> None:
        """`Owner`: a unit is closed only once the lifecycle let it go; nothing to move."""

    def failed(self, unit: Unit, exc: BaseException) -> None:
        """A unit failed (`Owner`): its partition's state moves now. Running: FAILED (no
        fetch, no renewal, no readiness counts it as open), its input paused, the unit
        closed without a commit, the partition opened again after its back-off (`heal`).
        Suspended: CLOSED, the unit closed; the next assignment opens it anew if it stays.
        Still opening: FAILED, its opening stopped, tried again after the back-off."""
        p, task = unit.partition, self.lifecycle.get(unit.partition)
        if task is None:
            return
        log.warning("partition %d: unit failed (%r); reopened from its last commit", p, exc)
        if task.unit is unit and task.state is UnitState.RUNNING:
            self.pause([p])
            self.openings.failing(p, exc)
            self._later(self.close(unit, commit=False), p)
        elif task.unit is unit:
            self.lifecycle.move(p, UnitState.CLOSED, unit=None)
            self._failures.forget(p)
            self._later(self.close(unit, commit=False), p)
        elif task.opening is not None and task.opening.unit is unit:
            stopped = task.opening
            if task.state is UnitState.SUSPENDED:
                self.lifecycle.move(p, UnitState.CLOSED, opening=None)
            else:
                self.openings.failing(p, exc)
            self._later(self._stop_opening(stopped.task, unit), p)

    async def _stop_opening(self, opening: asyncio.Task[None] | None, unit: Unit) -> None:
        """Stops an opening whose unit failed (its task no longer current) and closes the
        unit it had started."""
        if opening is not None:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
        await self.close(unit, commit=False)

    def _later(self, closing: Awaitable[None], p: int) -> None:
        """Closes a failed unit off the caller's path: `heal` waits for it."""
        task = asyncio.ensure_future(closing)
        task.set_name(f"close-{p}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _tps(self, partitions: list[int]) -> list[TopicPartition]:
        assert self.consumer is not None
        owned = self.consumer.assignment()
        tps = [TopicPartition(t, p) for p in partitions for t in self.topics]
        return [tp for tp in tps if tp in owned]

    def pause(self, partitions: list[int]) -> None:
        assert self.consumer is not None
        if tps := self._tps(partitions):
            self.consumer.pause(*tps)

    def _resume(self, partitions: list[int]) -> None:
        assert self.consumer is not None
        if tps := self._tps(partitions):
            self.consumer.resume(*tps)

    async def _seek(self, partitions: list[int]) -> None:
        assert self.consumer is not None
        tps = self._tps(partitions)
        committed = await asyncio.gather(*(self.consumer.committed(tp) for tp in tps))
        fresh = [tp for tp, offset in zip(tps, committed, strict=True) if offset is None]
        starts = await self.consumer.beginning_offsets(fresh) if fresh else {}
        for tp, offset in zip(tps, committed, strict=True):
            at = starts[tp] if offset is None else offset
            self.consumer.seek(tp, at)
            self.next[tp] = at

    async def close(self, unit: Unit, *, commit: bool) -> None:
        await unit.close(commit=commit)
        if self.on_close is not None:
            self.on_close(unit)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert self.consumer is not None
        await self.consumer.commit(offsets)

    async def heal(self) -> None:
        """Opens again each failed partition whose back-off is over (see `Failures`), once
        the units that failed are closed; a running unit that committed since its last
        failure starts its count again. Raises `PartitionFailing` for a partition that
        kept failing."""
        for task in self.lifecycle.in_state(UnitState.RUNNING):
            if task.unit is not None:
                self._failures.healthy(task.partition, task.unit)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        self.openings.retry()

    def states(self) -> dict[int, dict[str, Any]]:
        """Per input partition held here, its unit's state: open, restoring, failing or
        suspended."""
        return self.openings.states()
