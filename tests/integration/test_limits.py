"""Records at the limits, on the real broker: a huge key never crash-loops the worker and
its dead letter fits; an item over the token budget and an activity that keeps failing
each end in their own dead letter."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from instanced_stream.activities.worker import Activities
from instanced_stream.kafka.security import options_for
from instanced_stream.settings import DEFAULT_SPEC

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Deploy = Callable[..., Awaitable[Deployment]]


async def test_a_200_kb_key_is_dead_lettered_small_and_the_stream_goes_on(
    deploy: Deploy,
) -> None:
    dep = await deploy()
    huge = b"k" * 200_000
    await dep.produce([(huge, orjson.dumps({"comment": "no _instance: the key is the id"}))])
    await dep.produce_items([{"_instance": "after", "comment": "a fine remark"}])
    report = await dep.settle(2)
    assert report.unaccounted == 0
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None  # alive, not looping
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [d["code"] for d in letters] == ["no_instance"]
    assert len(orjson.dumps(letters[0])) < 100_000  # the key is not copied whole
    assert letters[0]["source"]["key"].endswith("(200000 bytes)")
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert [c["instance"] for c in calls] == ["after"]
    assert len(calls[0]["call_id"]) < 200


async def _limit_topic(bootstrap: str, topic: str, max_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    try:
        config = {"max.message.bytes": str(max_bytes)}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
    finally:
        await admin.close()


async def test_an_output_the_broker_refuses_as_too_large_is_dead_lettered_not_looped(
    deploy: Deploy,
) -> None:
    """The broker's own limit, lower than ours: its refusal is for good, so the item is
    dead-lettered with the broker's words and the stream goes on (no crash, no retry loop).
    Uncompressed: the broker's limit applies to compressed batches, and lz4 would shrink the
    repeated id below it."""
    dep = await deploy(STREAM_KAFKA_COMPRESSION="none")
    topic = dep.activity_topic("moderateComment")
    await dep.produce_items([{"_instance": "first", "comment": "a fine remark"}])
    assert (await dep.settle(1)).unaccounted == 0
    (first,) = await read_topic_sizes(dep, topic)
    await _limit_topic(dep.bootstrap, topic, first + 400)
    await asyncio.sleep(2)  # the broker applies the new limit
    long_id = "x" * 500  # in the call record twice: its instance, and its key (cut to 256)
    await dep.produce_items([{"_instance": long_id, "comment": "another fine remark"}])
    assert (await dep.settle(2)).unaccounted == 0
    await dep.produce_items([{"_instance": "after", "comment": "still flowing"}])
    report = await dep.settle(3)
    assert report.unaccounted == 0
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None  # alive, not looping
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [(d["code"], d.get("instance")) for d in letters] == [("too_large", long_id)], letters
    assert "broker refused" in letters[0]["reason"], letters[0]["reason"]
    calls = await dep.records(topic)
    assert sorted(c["instance"] for c in calls) == ["after", "first"]


async def read_topic_sizes(dep: Deployment, topic: str) -> list[int]:
    return [len(orjson.dumps(r)) for r in await dep.records(topic)]


async def test_an_item_over_the_token_budget_is_dead_lettered_too_large(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load(DEFAULT_SPEC.read_text())
    data.setdefault("window", {})["max_input_tokens"] = 3000
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(data))
    dep = await deploy(spec_path=spec)
    words = " ".join(f"word{i}" for i in range(4000))  # thousands of tokens, 40 KB
    await dep.produce_items(
        [{"_instance": "long", "comment": words}, {"_instance": "short", "comment": "nice"}]
    )
    report = await dep.settle(2)
    assert report.unaccounted == 0
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [(d["code"], d["source"]["key"]) for d in letters] == [("too_large", "long")]
    assert "tokens" in letters[0]["reason"]
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert [c["instance"] for c in calls] == ["short"]


async def test_an_activity_that_keeps_failing_is_dead_lettered_activity_failed(
    deploy: Deploy,
) -> None:
    dep = await deploy()
    registry = Activities()

    @registry.activity("moderateComment")
    async def broken(call: Any, tool: Any, context: Any) -> None:
        raise RuntimeError("the moderation backend is down")

    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        await dep.produce_items([{"_instance": f"a-{i}", "comment": "fine"} for i in range(2)])
        await dep.settle(2)
        for _ in range(120):
            letters = await dep.records(dep.settings.topics.dead_letter)
            if len(letters) >= 2:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await worker
    assert sorted((d["code"], d["instance"]) for d in letters) == [
        ("activity_failed", "a-0"),
        ("activity_failed", "a-1"),
    ]
    assert "the moderation backend is down" in letters[0]["reason"]
    assert registry.failed == 2
