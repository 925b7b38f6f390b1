"""Three brokers on one host, one cluster (testing/cluster.py): topics replicated to all
three, a group's coordinator that moves to another broker when its own is SIGKILLed, the
group's committed offsets kept through the move, and the broker back with its data."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import ensure_topics
from instanced_stream_bench.harness.coordinator import BrokerKiller
from instanced_stream_bench.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


async def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        found = await consumer.committed(tp)
        return None if found is None else int(found)
    finally:
        await consumer.stop()


async def _replicas(bootstrap: str, topic: str) -> list[int]:
    """Replicas per partition, once every broker's metadata has the new topic (10 s)."""
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            [described] = await admin.describe_topics([topic])
            parts = sorted(described["partitions"], key=lambda p: p["partition"])
            if (parts and described["error_code"] == 0) or time.monotonic() > deadline:
                return [len(p["replicas"]) for p in parts]
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def test_a_group_keeps_its_offsets_when_its_coordinator_broker_is_killed() -> None:
    cluster = LocalCluster(3)
    await asyncio.to_thread(cluster.start)
    try:
        bootstrap = cluster.bootstrap
        await ensure_topics(bootstrap, ["t"], 3, replication=3, config={"min.insync.replicas": "2"})
        assert await _replicas(bootstrap, "t") == [3, 3, 3]
        tp = TopicPartition("t", 0)
        # No auto-commit: closing would commit its own position (0) over the 5.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id="g", enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.commit({tp: OffsetAndMetadata(5, "")})
        finally:
            await consumer.stop()

        killer = BrokerKiller(cluster, down_s=3.0)
        killer.begin("g", time.monotonic(), lambda _: None)
        await killer.kill_coordinator(lambda: None)
        [kill] = killer.kills
        assert kill["coordinator_after"] not in (None, kill["node"]), kill
        assert kill["failover_s"] is not None and kill["failover_s"] < 60, kill
        assert kill["restart_error"] is None and cluster.running(kill["node"]), kill
        # The new coordinator loaded the group's offsets from its replica.
        assert await _committed(bootstrap, "g", tp) == 5
        # Writes that need two in-sync replicas go through with the broker back.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            meta = await producer.send_and_wait("t", b"after", partition=0)
        finally:
            await producer.stop()
        assert meta.offset >= 0
    finally:
        await asyncio.to_thread(cluster.stop)
