"""The assignor: which member of the processor group owns which partition number.

The processor's group subscribes to co-partitioned topics (input, results, approvals): the
unit of partition p applies the results and approvals of p in the same transactions as
p's input, so p of every topic must go to the same member. And a move costs: the unit's
store is restored, its producer fenced and initialised, its uncommitted work redone. So
this assignor (Kafka Streams' lesson, through aiokafka's public `AbstractPartitionAssignor`)
assigns partition *numbers*, each with every subscribed topic's partition of that number,
and keeps every number where it was unless the group's size (or the partition count)
changed; then it moves the fewest numbers that a balance within one allows.

What each member owned travels in its join's metadata (`user_data`): the numbers of its
last assignment and that assignment's epoch. The leader stamps every assignment with an
epoch one above all it heard, so when two members claim a number (one was put out of the
group and has not heard since), the claim from the newer assignment wins.

`assign_numbers` is the whole decision, pure; `CoPartitionedAssignor` is its wiring.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

import orjson
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from instanced_stream.faultpoints import NO_PROBE, Probe

__all__ = ["Claim", "CoPartitionedAssignor", "assign_numbers", "fewest_moves"]

log = logging.getLogger("stream.membership")


@dataclass(frozen=True, slots=True)
class Claim:
    """What a member owned: the numbers of the last assignment it was given, and that
    assignment's epoch (-1: none yet, a new member)."""

    epoch: int = -1
    partitions: frozenset[int] = field(default_factory=frozenset)

    def encode(self) -> bytes:
        return orjson.dumps({"epoch": self.epoch, "partitions": sorted(self.partitions)})

    @staticmethod
    def decode(data: bytes | None) -> Claim:
        """A member's user data; what cannot be read counts as owning nothing (a member of
        another version: it is given numbers, it just keeps none)."""
        if not data:
            return Claim()
        try:
            found = orjson.loads(data)
            epoch = int(found["epoch"])
            numbers = frozenset(int(p) for p in found["partitions"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("assignor: a member's user data is not a claim (%r); it keeps none", exc)
            return Claim()
        return Claim(epoch, numbers)


def _owners(members: Mapping[str, Claim], count: int) -> dict[str, list[int]]:
    """Each number below `count` to the member whose claim on it is the newest (ties:
    the first member id); numbers nobody claims are left out."""
    best: dict[int, tuple[int, str]] = {}
    for member in sorted(members):
        claim = members[member]
        for p in claim.partitions:
            if 0 <= p < count and (p not in best or claim.epoch > best[p][0]):
                best[p] = (claim.epoch, member)
    held: dict[str, list[int]] = {m: [] for m in members}
    for p in sorted(best):
        held[best[p][1]].append(p)
    return held


def assign_numbers(members: Mapping[str, Claim], count: int) -> dict[str, list[int]]:
    """Partition numbers 0..count-1 over `members`, each member's sorted list.

    Balanced within one (`count // len(members)` each, the remainder one more); a number
    stays with the member that owns it whenever the balance allows; of the members that
    own more than their share, the larger owners are the ones given one more, so the
    fewest numbers move (`fewest_moves`). The same members and claims give the same
    assignment, whatever the order they are given in."""
    if not members:
        return {}
    ids = sorted(members)
    held = _owners(members, count)
    base, extra = divmod(count, len(ids))
    # The remainder's extra numbers go to the largest owners: each keeps one more.
    by_size = sorted(ids, key=lambda m: (-len(held[m]), m))
    quota = {m: base + (1 if k < extra else 0) for k, m in enumerate(by_size)}
    kept = {m: held[m][: quota[m]] for m in ids}
    taken = {p for numbers in kept.values() for p in numbers}
    free = [p for p in range(count) if p not in taken]
    out: dict[str, list[int]] = {}
    at = 0
    for m in ids:
        need = quota[m] - len(kept[m])
        out[m] = sorted(kept[m] + free[at : at + need])
        at += need
    return out


def fewest_moves(members: Mapping[str, Claim], count: int) -> int:
    """The fewest numbers any balanced assignment moves away from a member that owns them
    and stays: found by trying every choice of the members given one more (for tests and
    small groups; `assign_numbers` is meant to reach it)."""
    if not members:
        return 0
    held = _owners(members, count)
    base, extra = divmod(count, len(members))
    best: int | None = None
    for lucky in combinations(sorted(members), extra):
        moves = sum(max(0, len(held[m]) - base - (m in lucky)) for m in members)
        best = moves if best is None else min(best, moves)
    assert best is not None
    return best


class CoPartitionedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """The processor group's assignor: one object per consumer (aiokafka takes objects;
    what this member owned is its own, so two consumers of one process, as in the tests,
    do not share it)."""

    name = "copartitioned-sticky"
    version = 0

    def __init__(self, probe: Probe = NO_PROBE) -> None:
        self.claim = Claim()
        self.probe = probe

    # aiokafka declares these as classmethods and calls them on what it was given: here
    # they are the instance's, because the claim is the member's.
    def assign(
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        topics = sorted({t for meta in members.values() for t in meta.subscription})
        counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
        count = max(counts.values(), default=0)
        if len(set(counts.values())) > 1:
            log.error(
                "assignor: the group's topics are not co-partitioned (%s); each number goes "
                "with the topics that have it",
                counts,
            )
        claims = {m: Claim.decode(meta.user_data) for m, meta in members.items()}
        numbers = assign_numbers(claims, count)
        epoch = max((c.epoch for c in claims.values()), default=-1) + 1
        stamp = orjson.dumps({"epoch": epoch})
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member, meta in members.items():
            mine = numbers[member]
            per_topic = [
                (t, [p for p in mine if p < counts.get(t, 0)]) for t in sorted(meta.subscription)
            ]
            out[member] = ConsumerProtocolMemberAssignment(self.version, per_topic, stamp)
        moved = sum(
            1 for m, c in claims.items() for p in c.partitions if p < count and p not in numbers[m]
        )
        log.info(
            "assignor: epoch %d, %d members, %d partitions, %d numbers moved from members that "
            "stay",
            epoch,
            len(members),
            count,
            moved,
        )
        return out

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, list(topics), self.claim.encode())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        # The group answered this member's sync: it holds these partitions for the
        # broker, and has not taken them yet.
        self.probe.at("joined")
        try:
            epoch = int(orjson.loads(assignment.user_data)["epoch"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            epoch = -1
        numbers = frozenset(p for _, partitions in assignment.assignment for p in partitions)
        self.claim = Claim(epoch, numbers)
