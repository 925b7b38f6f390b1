"""A join of the processor's group is one JoinGroup request (runtime/units/membership.py,
`assignors`).

aiokafka 0.14 sends one JoinGroup per listed assignor, each after the answer to the one
before (its join loop sits inside its loop over assignors; aiokafka pull request 1168).
With two protocols listed, a member's first request names one and its second two: the
broker sees the member's metadata change just as the generation completes and starts
another, and under restarts the group rebalanced about 70 times a minute for 7 minutes
with two partitions unserved (issue 44). These tests drive aiokafka's own join
(`CoordinatorGroupRebalance`, not public API: pinned here, so an aiokafka upgrade that
changes it fails loudly) against a coordinator that answers every request at once.
"""

from __future__ import annotations

from typing import Any

from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.protocol.group import JoinGroupRequest, SyncGroupRequest
from instanced_stream.runtime.units.assignor import CoPartitionedAssignor
from instanced_stream.runtime.units.rebalance import assignors


class _Answer:
    """Every field a JoinGroup or SyncGroup answer of aiokafka's is read for."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _Coordinator:
    """What `CoordinatorGroupRebalance` asks of its consumer's coordinator; it answers a
    JoinGroup as the broker answers a follower, and a SyncGroup with no partitions."""

    def __init__(self) -> None:
        self.member_id = JoinGroupRequest.UNKNOWN_MEMBER_ID
        self.generation = -1
        self._group_instance_id = None
        self._rebalance_timeout_ms = 30_000
        self.joins: list[list[str]] = []  # each JoinGroup's protocol names

    async def _send_req(self, request: Any) -> _Answer:
        if isinstance(request, JoinGroupRequest):
            self.joins.append([name for name, _meta in request._group_protocols])
            return _Answer(
                error_code=0,
                generation_id=len(self.joins),
                group_protocol=request._group_protocols[0][0],
                leader_id="the-leader",
                member_id="this-member",
                members=[],
            )
        assert isinstance(request, SyncGroupRequest)
        return _Answer(error_code=0, member_assignment=b"")

    def request_rejoin(self) -> None:
        raise AssertionError("the join should have succeeded")


class _Subscription:
    topics = frozenset({"items", "stream.results", "stream.approvals"})
    active = True


async def _joins(listed: tuple[Any, ...]) -> list[list[str]]:
    coordinator = _Coordinator()
    join = CoordinatorGroupRebalance(coordinator, "g", 0, _Subscription(), listed, 10_000, 100)
    assert await join.perform_group_join() is not None  # joined and synced
    return coordinator.joins


async def test_the_processor_joins_with_one_request_naming_its_protocol() -> None:
    assert await _joins(assignors()) == [["copartitioned-sticky"]]


async def test_two_listed_protocols_would_join_twice_with_changed_metadata() -> None:
    """What the processor listed before: the second request's protocols differ from the
    first's, which the broker takes for changed metadata (a new rebalance)."""
    listed = (CoPartitionedAssignor(), RangePartitionAssignor)
    assert await _joins(listed) == [
        ["copartitioned-sticky"],
        ["copartitioned-sticky", "range"],
    ]
