"""W3C traceparent: from an input record's headers onto every record it leads to, through
a real processor process; and an activity worker copies it onto an awaited call's result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from instanced_stream.activities.worker import Activities
from instanced_stream.core.messages import ActivityRecord
from instanced_stream.core.spec import Tool
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.topics import read_topic
from instanced_stream.kafka.tracing import traceparent_of
from instanced_stream.settings import Settings

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _parent(i: int) -> bytes:
    return f"00-{i + 1:032x}-{i + 1:016x}-01".encode()


async def test_every_output_record_carries_its_inputs_traceparent(
    deploy: Callable[..., Awaitable[Deployment]],
) -> None:
    dep = await deploy()
    records: list[tuple[bytes, bytes]] = [
        (f"t-{i}".encode(), orjson.dumps({"_instance": f"t-{i}", "comment": f"nice post {i}"}))
        for i in range(8)
    ]
    records.append((b"t-bad", b"{not json"))
    producer = AIOKafkaProducer(bootstrap_servers=dep.bootstrap, acks="all")
    await producer.start()
    sent: dict[int, bytes] = {}
    try:
        for i, (key, value) in enumerate(records):
            meta = await (
                await producer.send(
                    dep.settings.topics.input,
                    value,
                    key=key,
                    headers=[("traceparent", _parent(i))],
                )
            )
            sent[meta.offset * 1000 + meta.partition] = _parent(i)
    finally:
        await producer.stop()
    report = await dep.settle(len(records))
    assert report.unaccounted == 0
    topics = [
        *(dep.activity_topic(t.name) for t in dep.spec.tools if t.kind == "activity"),
        dep.settings.topics.no_action,
        dep.settings.topics.dead_letter,
    ]
    checked = 0
    for topic in topics:
        async for rec in read_topic(dep.bootstrap, topic):
            source = orjson.loads(rec.value)["source"]
            want = sent[source["offset"] * 1000 + source["partition"]]
            assert traceparent_of(rec.headers) == (("traceparent", want),), topic
            checked += 1
    assert checked >= len(records)


class _Capture:
    def __init__(self) -> None:
        self.records: list[OutRecord] = []

    async def publish(self, records: list[OutRecord]) -> None:
        self.records += records


async def test_worker_copies_the_traceparent_onto_the_result() -> None:
    registry = Activities()

    @registry.activity("decide")
    async def decide(call: Any, tool: Tool, context: list[dict[str, Any]]) -> str:
        return "ok"

    record = ActivityRecord.model_validate(
        {
            "call_id": "c-1",
            "tool": "decide",
            "instance": "i-1",
            "call": {"_tool": "decide", "_instance": "i-1", "_outputPath": "†state.d"},
            "source": {"topic": "items", "partition": 0, "offset": 7},
            "batch": {"id": "b", "size": 1, "token": "①", "attempt": 1},
            "model": "m",
        }
    )
    tool = Tool(name="decide", description="d")
    out = _Capture()
    trace = (("traceparent", _parent(41)),)
    await registry.serve_one(
        record.model_dump_json(by_alias=True).encode(),
        tool,
        Settings(),
        out,
        trace,
    )
    (result,) = out.records
    assert result.topic.endswith("stream.results")
    assert result.headers == trace
