"""The processor group's assignment on a real broker (runtime/units/assignor.py): three
members joining and one leaving, each a processor's Membership (its group consumer and
units). Partition p of the input, results and approvals topics is always one member's,
and a join or a leave moves only the numbers it must: the members that stay keep theirs."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from aiokafka.structs import TopicPartition
from instanced_stream.kafka.topics import ensure_topics
from instanced_stream.runtime.units.membership import GroupAddress, MemberBounds, Membership
from instanced_stream.runtime.units.producers import Producers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PARTITIONS = 6


def _member(bootstrap: str, group: str, topics: list[str], name: str) -> Membership:
    producers = Producers(
        bootstrap, group, transactional=False, transactional_prefix=f"{group}.{name}"
    )
    address = GroupAddress(bootstrap, group, topics, client_id=f"{group}-{name}")
    return Membership(address, producers, MemberBounds(session_timeout_s=6))


def _owned(member: Membership) -> set[int]:
    return set(member.units)


async def _settled(members: list[Membership], wait_s: float = 60) -> list[set[int]]:
    """Once every member serves its share: each owns the units of its partition numbers,
    no number twice, every number once, and no rebalance under way."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        owned = [_owned(m) for m in members]
        every = sorted(p for ps in owned for p in ps)
        if every == list(range(PARTITIONS)) and not any(m.rebalancing for m in members):
            return owned
        assert asyncio.get_running_loop().time() < deadline, f"never settled: {owned}"
        await asyncio.sleep(0.2)


def _copartitioned(member: Membership, topics: list[str]) -> None:
    """The member's consumer holds exactly p of every topic for each unit p it owns."""
    assert member.consumer is not None
    expected = {TopicPartition(t, p) for t in topics for p in member.units}
    assert member.consumer.assignment() == expected


async def test_numbers_go_together_and_stay_through_a_join_and_a_leave(bootstrap: str) -> None:
    prefix = f"t{secrets.token_hex(4)}."
    topics = [f"{prefix}input", f"{prefix}results", f"{prefix}approvals"]
    await ensure_topics(bootstrap, topics, PARTITIONS)
    group = f"{prefix}group"
    a, b, c = (_member(bootstrap, group, topics, n) for n in "abc")
    started: list[Membership] = []
    try:
        await a.start()
        started.append(a)
        (first,) = await _settled([a])
        assert first == set(range(PARTITIONS))

        await b.start()  # a join: a gives up half, nothing else moves
        started.append(b)
        a2, b2 = await _settled([a, b])
        assert len(a2) == len(b2) == 3 and a2 < first
        for m in (a, b):
            _copartitioned(m, topics)

        await c.start()  # a join: a and b each give one to c and keep the rest
        started.append(c)
        a3, b3, c3 = await _settled([a, b, c])
        assert len(a3) == len(b3) == len(c3) == 2
        assert a3 < a2 and b3 < b2
        for m in (a, b, c):
            _copartitioned(m, topics)

        await b.stop()  # a leave: only b's numbers move, a and c keep theirs
        started.remove(b)
        a4, c4 = await _settled([a, c])
        assert len(a4) == len(c4) == 3
        assert a3 < a4 and c3 < c4 and a4 | c4 == a3 | c3 | b3
        for m in (a, c):
            _copartitioned(m, topics)
    finally:
        for m in started:
            await m.stop()
