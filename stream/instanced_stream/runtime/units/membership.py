"""Membership: the processor's place in its consumer group, and the units it owns.

One aiokafka consumer (read_committed, no auto commit, the sticky co-partitioned assignor
of runtime/units/assignor.py, so partition p of the input, results and approvals topics
goes to one member and stays there while the group's size does) subscribes to the three
co-partitioned topics. The assignment callback only records what changed: each new
input partition's topics are paused and its unit is opened by a task of its own, outside
the callback, so the group's heartbeats go on however long a store takes to restore. A
unit's producer is started first (with exactly once, that fences the partition's earlier
owner and settles its open transaction), then its store is restored (`on_open`), then the
consumer is sought to the committed offsets, read only now that no earlier transaction
can still move them, and the partition resumes. Each partition opens on its own: one that
fails (the broker refuses, a bug) is retried after a back-off, shown as failing, and holds
no other back. A revocation commits each unit's finished prefix and suspends it (its
producer, store and work in flight kept): the next assignment resumes it where it was if
the partition stays here under the next epoch, else closes it. A unit that fails while it
runs (fenced, a failed transaction, a bug while staging) tells its owner, this
membership, which moves its partition to FAILED at once (`Membership.failed`): whoever
stages on it from then on gets `UnitGone`, nothing takes work to it; it is closed, opened
again after a back-off (`heal`), and everything staged on it is redone from the last
commit. Whether a unit serves is the lifecycle's answer (`Lifecycle.holds`), kept
nowhere else.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka import clients
from instanced_stream.runtime.units.assignor import CoPartitionedAssignor
from instanced_stream.runtime.units.fetcher import MAX_UNCOMMITTED, Fetcher
from instanced_stream.runtime.units.lifecycle import Lifecycle, Opening, UnitState
from instanced_stream.runtime.units.opening import Openings
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit import Unit

__all__ = ["UNSTABLE_PER_MIN", "Membership", "assignors"]

log = logging.getLogger("stream.membership")

OnOpen = Callable[[Unit], Awaitable[None]]

# Rebalances a minute above which the group is unstable: a deploy or a scale-out costs a
# few; more is a member that cannot get in (or keeps being put out), and readiness,
# the metrics and an alert say so.
UNSTABLE_PER_MIN = 6


def assignors(probe: Probe = NO_PROBE) -> tuple[CoPartitionedAssignor]:
    """The group's assignment protocols, one object per consumer: exactly one. aiokafka
    0.14 sends a JoinGroup per listed assignor, each after the previous one's answer (its
    join loop sits inside the loop over assignors), so with two the first join lists one
    protocol and the second two: the broker sees a member's metadata change while the
    generation completes and starts another one. Under restarts that kept a group
    rebalancing for minutes, two partitions unserved
    (tests/unit/runtime/units/test_join.py). Earlier versions listed this protocol first,
    so a rolling upgrade still finds it in common."""
    return (CoPartitionedAssignor(probe),)


def _identity(client_id: str | None, instance_id: str | None) -> dict[str, Any]:
    """The group consumer's client.id and, for static membership, its instance id: a
    restart under the same name within the session timeout gets its partitions back
    without a rebalance of the whole group (and a leave is not announced: the partitions
    wait out the session timeout)."""
    options: dict[str, Any] = {}
    if client_id:
        options["client_id"] = client_id
    if instance_id:
        options["group_instance_id"] = instance_id
    return options


class Membership(ConsumerRebalanceListener):  # type: ignore[misc]
    """`topics`: the input topic first, then the co-partitioned ones (results,
    approvals). `producers`: the units' (`Producers`). `units`: the open units, taking
    work; `opening`: the assigned partitions whose unit is being opened or waits to be
    opened again (`Openings`)."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topics: list[str],
        producers: Producers,
        *,
        session_timeout_s: float,
        on_open: OnOpen | None = None,
        on_close: Callable[[Unit], None] | None = None,
        client_id: str | None = None,
        group_instance_id: str | None = None,
        on_rebalance: Callable[[], None] = lambda: None,
        on_assigned: Callable[[int], None] = lambda _n: None,
        on_failed: Callable[[int, BaseException], None] = lambda _p, _e: None,
        progress: Callable[[int], int] = lambda _p: 0,
        max_uncommitted: int = MAX_UNCOMMITTED,
        probe: Probe = NO_PROBE,
    ) -> None:
        self.producers = producers
        # Each partition's one state (runtime/units/lifecycle.py); `units` (the running
        # ones, which the producers' renewal reads too) and `opening` are views of it.
        self.lifecycle = Lifecycle()
        self.units = producers.owned = self.lifecycle.running
        self.bootstrap, self.group_id = bootstrap, group_id
        self.topics, self.input = topics, topics[0]
        self.session_timeout_s = session_timeout_s
        self.on_open, self.on_close = on_open, on_close
        self.identity = _identity(client_id, group_instance_id)
        self.on_rebalance, self.on_assigned = on_rebalance, on_assigned
        abandon = functools.partial(self._close, commit=False)  # a unit that never served
        self.openings = Openings(
            self.lifecycle, self._open, self._opened, abandon, on_failed, progress
        )
        self.opening = self.lifecycle.opening
        self._failures = self.openings.failures
        self.rebalancing = False
        self.rebalances = 0
        self._rebalanced: deque[float] = deque()  # when each rebalance began, last minute
        self.started_at = time.monotonic()
        self.assigned_at: float | None = None  # the last assignment taken
        self.strategy = assignors(probe)
        # Reads the running units' records (the walk's first stage); `_next`, the offset
        # each partition owes next, is its: this membership seeks and resumes by it.
        self.fetcher = Fetcher(
            self.input, self.units, self.opening, max_uncommitted=max_uncommitted
        )
        self._next = self.fetcher.next
        self._closing: set[asyncio.Task[None]] = set()  # failed units being closed

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The group consumer (once started), which the fetcher reads."""
        return self.fetcher.consumer

    @consumer.setter
    def consumer(self, consumer: AIOKafkaConsumer | None) -> None:
        self.fetcher.consumer = consumer

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.producers.start()
        self.consumer = clients.consumer(
            self.bootstrap,
            group_id=self.group_id,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            partition_assignment_strategy=self.strategy,
            session_timeout_ms=int(self.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.session_timeout_s * 1000 / 5),
            max_poll_interval_ms=300_000,
            **self.identity,
        )
        self.consumer.subscribe(self.topics, listener=self)
        await self.consumer.start()

    def leaving(self) -> None:
        """The processor stops: from now on an assignment is not taken (no unit opens, no
        producer starts), even while it drains; what it owned goes to the members that
        stay once it has left."""
        self.openings.stopping = True

    async def stop(self) -> None:
        """Commits what every running unit finished, closes every unit (running or
        suspended) and every opening, leaves the group."""
        self.leaving()
        for last in (False, True):  # again after the consumer stopped: whatever came
            await self._close_all(commit=not last)
            if not last and self.consumer is not None:
                await self.consumer.stop()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self.producers.stop()

    async def _close_all(self, *, commit: bool) -> None:
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
                await self._close(unit, commit=False)

    @staticmethod
    async def _last_commit(unit: Unit) -> None:
        try:
            await unit.commit()
        except Exception as exc:
            log.warning("partition %d: last commit failed: %r", unit.partition, exc)

    # ------------------------------------------------------------------ rebalances

    def _epoch(self) -> int:
        """The epoch of the assignment this member holds now (the assignor's stamp)."""
        return self.strategy[0].claim.epoch

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Suspends every partition revoked: a running unit commits its finished prefix
        and is kept; a restore under way goes on. The next assignment says which stay."""
        self.rebalancing = True
        self.rebalances += 1
        self._rebalanced.append(time.monotonic())
        self.on_rebalance()
        gone = sorted({tp.partition for tp in revoked if tp.topic == self.input})
        # Moved before the first wait: `heal` or an opening finishing meanwhile finds
        # them suspended, never half there.
        running = []
        for p in gone:
            task = self.lifecycle.get(p)
            if task is None or task.state is UnitState.SUSPENDED:
                continue
            if task.state is UnitState.RUNNING and task.unit is not None:
                running.append(task.unit)
            self.lifecycle.move(p, UnitState.SUSPENDED)  # an opening seeks nothing now
        for unit in running:
            try:
                await unit.commit()
            except Exception as exc:  # the unit is void: replaced if its partition returns
                log.warning("partition %d: commit on revocation failed: %r", unit.partition, exc)
        if gone:
            log.info("rebalance: partitions %s revoked; finished work committed", gone)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Resumes the suspended partitions assigned here again under the next epoch,
        closes the others, and starts opening what is new, each partition in a task of its
        own: the group waits for this callback, and a member that takes longer than its
        session timeout is put out of the group. A stopping member takes nothing."""
        try:
            if self.openings.stopping:
                log.info("rebalance: assignment not taken, the processor is stopping")
                return
            mine = {tp.partition for tp in assigned if tp.topic == self.input}
            epoch = self._epoch()
            self.assigned_at = time.monotonic()
            self.on_assigned(len(mine))
            for tp in [tp for tp in self._next if tp.partition not in mine]:
                del self._next[tp]
            resumed, restoring, closed = await self._settle(mine, epoch)
            new = sorted(mine - set(self.lifecycle.tasks))
            if new:
                self._pause(new)  # nothing of theirs is fetched until their unit is sought
                for p in new:
                    self.openings.begin(Opening(p), epoch)
            log.info(
                "rebalance: partitions %s resumed, %s closed, %s opening; %s restoring on "
                "(epoch %d)",
                resumed,
                closed,
                new,
                restoring,
                epoch,
            )
        finally:
            self.rebalancing = False

    async def _settle(self, mine: set[int], epoch: int) -> tuple[list[int], list[int], list[int]]:
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
                self._resumed(unit)
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
                        await self._close(unit, commit=False)  # committed when suspended
                closed.append(p)
        return resumed, restoring, closed

    def _resumed(self, unit: Unit) -> None:
        """A suspended unit takes work again where it was: each of its topics is read on
        from the record after the last one it tracked (what it had in flight stays in
        flight), not from the committed offsets."""
        assert self.consumer is not None
        for tp in self._tps([unit.partition]):
            if tp in self._next:
                self.consumer.seek(tp, self._next[tp])

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

    # ------------------------------------------------------------------ the units' owner

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
            self._pause([p])
            self.openings.failing(p, exc)
            self._later(self._close(unit, commit=False), p)
        elif task.unit is unit:
            self.lifecycle.move(p, UnitState.CLOSED, unit=None)
            self._failures.forget(p)
            self._later(self._close(unit, commit=False), p)
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
        await self._close(unit, commit=False)

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

    def _pause(self, partitions: list[int]) -> None:
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
            self._next[tp] = at

    async def _close(self, unit: Unit, *, commit: bool) -> None:
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

    def rebalances_last_min(self) -> int:
        """Rebalances that began in the last 60 s."""
        while self._rebalanced and self._rebalanced[0] < time.monotonic() - 60:
            self._rebalanced.popleft()
        return len(self._rebalanced)

    def group(self) -> dict[str, Any]:
        """This member's place in its group: `stable` once it holds an assignment and no
        rebalance is under way, the epoch of its assignment (the leader's stamp), how long
        it has waited for its first assignment, rebalances in the last minute."""
        claim = self.strategy[0].claim
        waited = None if self.assigned_at else round(time.monotonic() - self.started_at, 1)
        per_min = self.rebalances_last_min()
        return {
            "stable": self.stable(),
            "epoch": claim.epoch,
            "waiting_for_assignment_s": waited,
            "rebalances_last_min": per_min,
            "storm": per_min > UNSTABLE_PER_MIN,
        }

    def partitions(self) -> int:
        """Partitions of the input topic, as the consumer's metadata knows them."""
        if self.consumer is None:
            return 0
        return len(self.consumer.partitions_for_topic(self.input) or ())

    def stable(self) -> bool:
        return self.assigned_at is not None and not self.rebalancing
