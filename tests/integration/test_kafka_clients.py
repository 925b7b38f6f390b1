"""Kafka client conventions, on a real broker: a processor joins with a client.id that names
its process; given STREAM_GROUP_INSTANCE_ID it is a static member (KIP-345): stopped, it
stays in the group for its session (a restart under the same name gets its partitions
back without a rebalance), where a dynamic member leaves at once; and the configured
compression round-trips."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from instanced_stream.kafka import clients
from instanced_stream.settings import Settings
from instanced_stream_bench.harness.demo import launch_processor
from instanced_stream_bench.testing.sim.server import Simulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


async def _members(bootstrap: str, group: str) -> list[dict[str, Any]]:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
    except KafkaError:  # the group's coordinator is not elected yet
        return []
    finally:
        await admin.close()
    (described,) = response.to_object()["groups"]
    return list(described["members"])


async def _after_stop(
    bootstrap: str, url: str, **env: str
) -> tuple[Settings, list[dict[str, Any]], list[dict[str, Any]], int]:
    """A processor joins, is stopped (SIGTERM); the group's members before and after."""
    settings, _, proc = await launch_processor(
        bootstrap,
        url,
        f"t{secrets.token_hex(4)}.",
        "stream-test-",
        None,
        STREAM_DELIVERY="exactly_once",
        # Long, so a static member's session cannot end while the test looks.
        STREAM_SESSION_TIMEOUT_S="45",
        **env,
    )
    group = settings.topic_prefix + settings.app_id
    try:
        deadline = time.monotonic() + 60
        while not (joined := await _members(bootstrap, group)):
            assert time.monotonic() < deadline, f"never joined:\n{proc.tail()}"
            await asyncio.sleep(0.5)
    finally:
        pid = proc.proc.pid if proc.proc else -1
        await asyncio.to_thread(proc.stop)
    return settings, joined, await _members(bootstrap, group), pid


async def test_static_member_keeps_its_place_and_names_its_process(
    bootstrap: str, simulator: tuple[Simulator, str]
) -> None:
    _, url = simulator
    settings, joined, after, pid = await _after_stop(
        bootstrap, url, STREAM_GROUP_INSTANCE_ID="processor-0"
    )
    (member,) = joined
    group = settings.topic_prefix + settings.app_id
    assert member["client_id"] == member["client_id"].strip()
    assert member["client_id"].startswith(f"{group}-{socket.gethostname()}-{pid}-")
    # Static: no leave on a stop; the member is there until its session ends.
    assert [m["member_id"] for m in after] == [member["member_id"]]
    # The control: a dynamic member leaves the group as it stops.
    _, joined, after, _ = await _after_stop(bootstrap, url)
    assert len(joined) == 1
    assert after == []


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
async def test_compressed_records_round_trip(bootstrap: str, compression: str) -> None:
    topic = f"compressed-{compression}-{secrets.token_hex(4)}"
    clients.register_producer(bootstrap, compression)
    try:
        producer = clients.producer(bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b'{"x": 1}' * 200, key=b"k")
        finally:
            await producer.stop()
    finally:
        clients.register_producer(bootstrap, "none")
    consumer = clients.consumer(bootstrap, topic, auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    assert record.value == b'{"x": 1}' * 200
