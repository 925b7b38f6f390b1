"""The rebalance listener: the group's callbacks, and this member's place in the group.
A revocation suspends every revoked partition (its producer, store and work in flight
kept), gives the batches in flight with items of its running units a bounded time to come
back (`Landed`), and commits each running unit's finished prefix; the next assignment resumes
each suspended partition that stays here under the next epoch (nobody else can have
held it in between), closes the others and starts opening what is new, each partition
in a task of its own outside the callback, so the group's heartbeats go on however long
a store takes to restore. What is done to the units is their manager's
(runtime/units/unit_manager.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.runtime.units.assignor import CoPartitionedAssignor
from instanced_stream.runtime.units.unit import Unit
from instanced_stream.runtime.units.unit_manager import UnitManager

__all__ = ["UNSTABLE_PER_MIN", "Landed", "Rebalance", "assignors"]

# Waits up to the given seconds for the batches in flight with items on these units to be
# staged on them; returns how many were not (the pipeline's `Stager.landed`).
Landed = Callable[[list[Unit], float], Awaitable[int]]

log = logging.getLogger("stream.membership")

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


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The group's callbacks for the member reading `input` (and its co-partitioned
    topics), acted on the units' `manager`. `on_rebalance`: told each rebalance;
    `on_assigned`: told how many input partitions each assignment gives; `landed`: waits
    for the batches in flight on revoked units, at most `landing_s`."""

    def __init__(
        self,
        input: str,
        manager: UnitManager,
        *,
        on_rebalance: Callable[[], None] = lambda: None,
        on_assigned: Callable[[int], None] = lambda _n: None,
        landed: Landed | None = None,
        landing_s: float = 0.0,
        probe: Probe = NO_PROBE,
    ) -> None:
        self.input, self.manager = input, manager
        self.on_rebalance, self.on_assigned = on_rebalance, on_assigned
        self.landed, self.landing_s = landed, landing_s
        self.strategy = assignors(probe)
        self.rebalancing = False
        self.rebalances = 0
        self._rebalanced: deque[float] = deque()  # when each rebalance began, last minute
        self.started_at = time.monotonic()
        self.assigned_at: float | None = None  # the last assignment taken

    def _epoch(self) -> int:
        """The epoch of the assignment this member holds now (the assignor's stamp)."""
        return self.strategy[0].claim.epoch

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Suspends every partition revoked: a running unit waits for its batches in
        flight (bounded), commits its finished prefix and is kept; a restore under way
        goes on. The next assignment says which stay."""
        self.rebalancing = True
        self.rebalances += 1
        self._rebalanced.append(time.monotonic())
        self.on_rebalance()
        gone = sorted({tp.partition for tp in revoked if tp.topic == self.input})
        running = self.manager.suspend(gone)
        if running and self.landed is not None and not self.manager.openings.stopping:
            await self._land(self.landed, running)
        for unit in running:
            try:
                await unit.commit()
            except Exception as exc:  # the unit is void: replaced if its partition returns
                log.warning("partition %d: commit on revocation failed: %r", unit.partition, exc)
        if gone:
            log.info("rebalance: partitions %s revoked; finished work committed", gone)

    async def _land(self, landed: Landed, running: list[Unit]) -> None:
        """Why wait here, before giving the partitions up: an answer that comes back
        after its partition moved cannot be staged here, and its journal entry
        (runtime/pipeline/journal.py) lands after the new owner read the journal when it
        opened, so the new owner asks the model again: the answer paid twice (issue 55).
        Waiting here lets the answers be journaled and staged on the suspended units, and
        this revocation's commit carries their outcomes: the new owner starts after them
        and redoes nothing. The new owner cannot wait instead: it does not know what an
        earlier owner still has in flight, and the eager protocol opens nothing until
        every member has rejoined, so no unit anywhere opens in between. The cost is a
        rebalance longer by what is left of the batches in flight (their answer's time,
        not a fixed wait), bounded by `landing_s`, which stays within the group's
        rebalance timeout, so this member is not put out for waiting. What is not back by
        then is left to the partition's next owner, as before. A stopping member's drain
        already gave its batches their time."""
        began = time.monotonic()
        missed = await landed(running, self.landing_s)
        waited = time.monotonic() - began
        parts = sorted(u.partition for u in running)
        if missed:
            log.warning(
                "rebalance: %d batches in flight for partitions %s not back within %.1fs; "
                "their partitions' next owners may ask again",
                missed,
                parts,
                waited,
            )
        elif waited >= 0.01:
            log.info(
                "rebalance: batches in flight for partitions %s landed in %.2fs", parts, waited
            )

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Resumes the suspended partitions assigned here again under the next epoch,
        closes the others, and starts opening what is new, each partition in a task of its
        own: the group waits for this callback, and a member that takes longer than its
        session timeout is put out of the group. A stopping member takes nothing."""
        try:
            if self.manager.openings.stopping:
                log.info("rebalance: assignment not taken, the processor is stopping")
                return
            mine = {tp.partition for tp in assigned if tp.topic == self.input}
            epoch = self._epoch()
            self.assigned_at = time.monotonic()
            self.on_assigned(len(mine))
            self.manager.keep_positions(mine)
            resumed, restoring, closed = await self.manager.settle(mine, epoch)
            new = sorted(mine - set(self.manager.lifecycle.tasks))
            self.manager.begin(new, epoch)  # nothing of theirs is fetched until sought
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

    def stable(self) -> bool:
        return self.assigned_at is not None and not self.rebalancing
