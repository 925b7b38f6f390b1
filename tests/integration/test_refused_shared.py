"""At least once, on a real broker: a record the broker refuses for itself (over its
topic's `max.message.bytes`) is replaced by its item's dead letter, and the partition it
was bound for takes every later record. The units share one idempotent producer, and the
refused batch's sequence numbers were never taken back: without a new producer, every
later send to that partition failed with OutOfOrderSequenceNumber, from every unit."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.topics import ensure_topics, read_topic
from instanced_stream.runtime.units.membership import GroupAddress, MemberBounds, Membership
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit import Unit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

LIMIT = 4096


async def _committed(unit: Unit, commits: int, wait_s: float = 30) -> None:
    """Until the unit's own commit loop has committed `commits` times (or it failed)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while unit.held and unit.commits < commits:
        assert asyncio.get_running_loop().time() < deadline, "no commit"
        await asyncio.sleep(0.05)
    assert unit.held, f"the unit failed: {unit.failed!r}"


async def test_a_refused_record_does_not_break_its_partition_for_later_sends(
    bootstrap: str,
) -> None:
    prefix = f"t{secrets.token_hex(4)}."
    topics = [f"{prefix}input", f"{prefix}results", f"{prefix}approvals"]
    out, letters = f"{prefix}activity.x", f"{prefix}deadletter"
    await ensure_topics(bootstrap, [*topics, letters], 1)
    await ensure_topics(bootstrap, [out], 1, config={"max.message.bytes": str(LIMIT)})
    replaced: list[str] = []

    def replace(record: OutRecord, said: str) -> list[OutRecord]:
        replaced.append(said)
        return [OutRecord(letters, record.key, b'{"code": "too_large"}', partition=0)]

    group = f"{prefix}group"
    shared = Producers(
        bootstrap, group, transactional=False, transactional_prefix=prefix, replace=replace
    )
    member = Membership(GroupAddress(bootstrap, group, topics), shared, MemberBounds(6))
    await member.start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while 0 not in member.units:
            assert asyncio.get_running_loop().time() < deadline, "never assigned"
            await asyncio.sleep(0.1)
        unit = member.units[0]
        # The producer has written to the partition before (the broker checks the
        # sequence numbers of a producer it knows there; a new one may start anywhere).
        unit.stage([OutRecord(out, b"z", b'{"n": 0}', partition=0)])
        await _committed(unit, 1)
        # Both batch-mates and the big one go to partition 0 of the same topic.
        unit.stage(
            [
                OutRecord(out, b"a", b'{"n": 1}', partition=0),
                OutRecord(out, b"b", b'{"big": "' + b"x" * (2 * LIMIT) + b'"}', partition=0),
                OutRecord(out, b"c", b'{"n": 2}', partition=0),
            ]
        )
        await _committed(unit, 2)
        assert len(replaced) == 1  # the precondition: the broker refused the big record
        # Later work, to the same partition.
        unit.stage([OutRecord(out, b"d", b'{"n": 3}', partition=0)])
        await _committed(unit, 3)
        written = [rec.value async for rec in read_topic(bootstrap, out)]
        assert written == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
        assert [rec.key async for rec in read_topic(bootstrap, letters)] == [b"b"]
    finally:
        await member.stop()
