"""Membership: the processor's place in its consumer group, in three parts. One aiokafka
consumer (read_committed, no auto commit, the sticky co-partitioned assignor of
runtime/units/assignor.py, so partition p of the input, results and approvals topics
goes to one member and stays there while the group's size does) subscribes to the three
co-partitioned topics. Its rebalance listener (`Rebalance`, runtime/units/rebalance.py)
takes the group's callbacks; the units' manager (`UnitManager`, runtime/units/unit_manager.py)
drives each partition's lifecycle and owns the units (a revoked unit is suspended, not
dropped; a failed one moves its partition at once); the fetcher (`Fetcher`,
runtime/units/fetcher.py) reads the running units' records. This module builds the
three around the one consumer, starts and stops them. What it is given comes as frozen
values, each handed on whole by the composition root (runtime/assembly.py) instead of a
keyword list: where it joins (`GroupAddress`), its timeouts and caps (`MemberBounds`) and
what it tells the service and asks of it (`MemberHooks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka import clients
from instanced_stream.runtime.units.fetcher import MAX_UNCOMMITTED, Fetcher
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.rebalance import Landed, Rebalance
from instanced_stream.runtime.units.unit import Unit
from instanced_stream.runtime.units.unit_manager import OnOpen, UnitManager

__all__ = ["GroupAddress", "MemberBounds", "MemberHooks", "Membership"]


@dataclass(frozen=True, slots=True)
class GroupAddress:
    """Where the member joins: the broker, the group, the topics it subscribes to (the
    input topic first, then the co-partitioned ones: results, approvals), and the names it
    joins under (`client_id`; `group_instance_id` for static membership, see
    `_identity`)."""

    bootstrap: str
    group_id: str
    topics: list[str]
    client_id: str | None = None
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class MemberBounds:
    """How long and how much: the group's session timeout (its heartbeats follow it), the
    records a unit may have tracked and not committed before its input is held
    (`max_uncommitted`), and how long a revocation may wait for the batches in flight
    (`landing_s`; 0 unless `MemberHooks.landed` is given)."""

    session_timeout_s: float
    max_uncommitted: int = MAX_UNCOMMITTED
    landing_s: float = 0.0


@dataclass(frozen=True, slots=True)
class MemberHooks:
    """What the member tells the service and asks of it. Told: a unit opened (`on_open`,
    awaited in its open task; None: nothing to restore) or closed (`on_close`), a
    rebalance began (`on_rebalance`), how many partitions an assignment gave it
    (`on_assigned`), a partition failed (`on_failed`). Asked: a partition's records
    restored so far (`restore_progress`), and to let the batches in flight on revoked
    units come back (`landed`; None: a revocation does not wait)."""

    on_open: OnOpen | None = None
    on_close: Callable[[Unit], None] | None = None
    on_rebalance: Callable[[], None] = lambda: None
    on_assigned: Callable[[int], None] = lambda _n: None
    on_failed: Callable[[int, BaseException], None] = lambda _p, _e: None
    restore_progress: Callable[[int], int] = lambda _p: 0
    landed: Landed | None = None


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


class Membership:
    """`address`: where it joins (`GroupAddress`). `producers`: the units' (`Producers`).
    `bounds`: its timeouts and caps (`MemberBounds`). `hooks`: what it tells the service
    and asks of it (`MemberHooks`; none by default). `units`: the open units, taking
    work; `opening`: the assigned partitions whose unit is being opened or waits to be
    opened again; both views of `lifecycle`."""

    def __init__(
        self,
        address: GroupAddress,
        producers: Producers,
        bounds: MemberBounds,
        hooks: MemberHooks | None = None,
        *,
        probe: Probe = NO_PROBE,
    ) -> None:
        hooks = hooks if hooks is not None else MemberHooks()
        self.bootstrap, self.group_id = address.bootstrap, address.group_id
        self.topics, self.input = address.topics, address.topics[0]
        self.session_timeout_s = bounds.session_timeout_s
        # A revocation may wait this long for the batches in flight (`Rebalance._land`);
        # the caller keeps it within the group's rebalance timeout (the session's).
        self.landing_s = bounds.landing_s if hooks.landed is not None else 0.0
        self.identity = _identity(address.client_id, address.group_instance_id)
        self.producers = producers
        next_offsets: dict[TopicPartition, int] = {}  # the fetcher's; seeking writes it
        self.manager = UnitManager(
            self.topics,
            producers,
            next_offsets,
            on_open=hooks.on_open,
            on_close=hooks.on_close,
            on_failed=hooks.on_failed,
            progress=hooks.restore_progress,
        )
        self.lifecycle = self.manager.lifecycle
        self.units, self.opening = self.manager.units, self.manager.opening
        self.fetcher = Fetcher(
            self.input, self.units, self.opening, max_uncommitted=bounds.max_uncommitted
        )
        self.fetcher.next = next_offsets
        self.rebalance = Rebalance(
            self.input,
            self.manager,
            on_rebalance=hooks.on_rebalance,
            on_assigned=hooks.on_assigned,
            landed=hooks.landed,
            landing_s=self.landing_s,
            probe=probe,
        )
        # The rebalance listener's, named here for the service and readiness.
        self.strategy = self.rebalance.strategy
        self.on_partitions_revoked = self.rebalance.on_partitions_revoked
        self.on_partitions_assigned = self.rebalance.on_partitions_assigned
        self.group, self.stable = self.rebalance.group, self.rebalance.stable
        # The manager's.
        self.heal, self.states = self.manager.heal, self.manager.states

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The group consumer (once started), which the manager and the fetcher use."""
        return self.fetcher.consumer

    @consumer.setter
    def consumer(self, consumer: AIOKafkaConsumer | None) -> None:
        self.fetcher.consumer = self.manager.consumer = consumer

    @property
    def rebalancing(self) -> bool:
        return self.rebalance.rebalancing

    @property
    def rebalances(self) -> int:
        return self.rebalance.rebalances

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
        self.consumer.subscribe(self.topics, listener=self.rebalance)
        await self.consumer.start()

    def leaving(self) -> None:
        """The processor stops: from now on an assignment is not taken (no unit opens, no
        producer starts), even while it drains; what it owned goes to the members that
        stay once it has left."""
        self.manager.openings.stopping = True

    async def stop(self) -> None:
        """Commits what every running unit finished, closes every unit (running or
        suspended) and every opening, leaves the group."""
        self.leaving()
        for last in (False, True):  # again after the consumer stopped: whatever came
            await self.manager.close_all(commit=not last)
            if not last and self.consumer is not None:
                await self.consumer.stop()
        await self.manager.closing()
        await self.producers.stop()

    def partitions(self) -> int:
        """Partitions of the input topic, as the consumer's metadata knows them."""
        if self.consumer is None:
            return 0
        return len(self.consumer.partitions_for_topic(self.input) or ())
