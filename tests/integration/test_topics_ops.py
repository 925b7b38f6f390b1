"""Topic creation settings, the stateful partition check and `audit --since`, against a
real broker (single node: replication factor 1 is its default)."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from instanced_stream.core.spec import load_spec
from instanced_stream.errors import StreamError
from instanced_stream.kafka.topics import check_partitions, ensure_product_topics, ensure_topics
from instanced_stream.ops.audit import audit
from instanced_stream.settings import Settings
from instanced_stream_bench.harness.demo import produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _settings(bootstrap: str, **kw: object) -> Settings:
    return Settings(bootstrap_servers=bootstrap, topic_prefix=f"t{secrets.token_hex(3)}.", **kw)  # type: ignore[arg-type]


async def _describe(bootstrap: str, topic: str) -> tuple[int, str | None]:
    """Replicas of partition 0 and the topic's min.insync.replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None})]
        )
    finally:
        await admin.close()
    entries = {e[0]: e[1] for r in response.resources for e in r[4]}
    return len(described["partitions"][0]["replicas"]), entries.get("min.insync.replicas")


async def test_created_topics_take_the_replication_settings(bootstrap: str) -> None:
    settings = _settings(bootstrap, partitions=1, min_insync_replicas=1)
    await ensure_product_topics(bootstrap, settings, load_spec(settings.spec))
    assert await _describe(bootstrap, settings.topics.input) == (1, "1")
    # More replicas than the one broker: refused loudly, not silently missing.
    with pytest.raises(StreamError, match="refused to create topics"):
        await ensure_topics(bootstrap, [f"{settings.topic_prefix}x"], 1, replication=3)


async def test_stateful_start_refuses_added_partitions(bootstrap: str) -> None:
    settings = _settings(bootstrap, partitions=2)
    await ensure_product_topics(bootstrap, settings, load_spec(settings.spec))
    await check_partitions(bootstrap, settings)  # consistent: no error
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({settings.topics.input: NewPartitions(total_count=3)})
    finally:
        await admin.close()
    # The broker lists new topics and partitions a moment after the change.
    deadline = time.monotonic() + 20
    while True:
        try:
            await check_partitions(bootstrap, settings)
        except StreamError as exc:
            refusal = exc.message
            if "changelog: 2" in refusal:
                break
        assert time.monotonic() < deadline, "added partitions never refused"
        await asyncio.sleep(0.3)
    assert "items: 3" in refusal and "Growing a stateful deployment" in refusal


async def test_audit_since_reads_only_the_recent_part(bootstrap: str) -> None:
    settings = _settings(bootstrap, partitions=1)
    spec = load_spec(settings.spec)
    await ensure_product_topics(bootstrap, settings, spec)
    await produce(bootstrap, settings.topics.input, [(b"k", b"{}")] * 5)
    whole = await audit(bootstrap, settings.topics, [])
    recent = await audit(bootstrap, settings.topics, [], since=("offset", 3))
    future = await audit(bootstrap, settings.topics, [], since=("time", 2**42))
    assert (whole.inputs, recent.inputs, future.inputs) == (5, 2, 0)
    assert [pos[2] for pos in recent.missing] == [3, 4]
