"""The replies (runtime/pipeline/replies.py): a result or an approval read where its
instance does not live is forwarded there by the one forwarding function, written by
staging; a stateless spec reads and commits them, deciding nothing; a unit gone is said
with `UnitGone`, never written on."""

from __future__ import annotations

import orjson
import pytest
from aiokafka import ConsumerRecord
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.publish import forwarded_from, home_partition
from instanced_stream.runtime.pipeline.replies import Replies
from instanced_stream.runtime.units.fetcher import Fetched
from instanced_stream.runtime.units.unit import UnitGone
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import TICKETS, Rig


def _replies(rig: Rig, ready: list[object]) -> Replies:
    return Replies(
        rig.stager.staging,
        rig.answers,
        lambda unit, insts: ready.extend(insts),
        results=rig.topics.results,
        partitions=rig.settings.partitions,
    )


def _fetched(rig: Rig, topic: str, partition: int, value: bytes) -> Fetched:
    unit = rig.unit(partition)
    slot = unit.track(topic, 0)
    rec: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        topic, partition, 0, 0, 0, None, value, None, 0, len(value), [("h", b"v")]
    )
    return Fetched(unit, rec, slot)


async def test_an_approval_read_elsewhere_is_forwarded_to_its_instance_s_partition() -> None:
    rig = Rig(load_spec(TICKETS), partitions=4)
    home = home_partition("t-9", 4)
    elsewhere = (home + 1) % 4
    value = orjson.dumps({"instance": "t-9", "approved": True})
    got = _fetched(rig, rig.topics.approvals, elsewhere, value)
    ready: list[object] = []
    await _replies(rig, ready).take(got)
    assert got.slot.done and not ready  # settled here: nothing applied
    await rig.drain()
    (sent,) = [r for r in rig.records if r.topic == rig.topics.approvals]
    assert sent.partition == home and forwarded_from(sent.headers) == (
        rig.topics.approvals,
        elsewhere,
        0,
    )
    assert rig.metrics.counts()["forwarded"] == 1
    assert rig.offsets(rig.topics.approvals) == {elsewhere: 1}


async def test_a_stateless_spec_reads_and_commits_a_result_deciding_nothing() -> None:
    rig = Rig(load_spec(DEFAULT_SPEC))
    got = _fetched(rig, rig.topics.results, 0, b'{"instance": "p-1"}')
    await _replies(rig, []).take(got)
    await rig.drain()
    assert rig.metrics.counts()["results_ignored"] == 1
    assert rig.offsets(rig.topics.results) == {0: 1} and not rig.records


async def test_a_reply_on_a_unit_gone_is_said_not_written() -> None:
    rig = Rig(load_spec(DEFAULT_SPEC))
    got = _fetched(rig, rig.topics.results, 0, b'{"instance": "p-1"}')
    got.unit.fail(RuntimeError("fenced meanwhile"))
    with pytest.raises(UnitGone):
        await _replies(rig, []).take(got)
    assert not got.slot.done
