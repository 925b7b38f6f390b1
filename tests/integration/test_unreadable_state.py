"""A state the store cannot read stops nothing: one cut-off JSON value on partition 2 of
the tickets example's state changelog (6 partitions), and a processor started on it
decides every ticket of every partition, while the record is quarantined to the
dead-letter topic with its key, partition, offset and reason, and its key's tombstone
written with it (a later restore does not find it again). Before, the assignment
callback raised on it and no partition's unit was registered at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from instanced_stream.activities.worker import load_activities
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import read_json, read_topic, state_changelog
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = Path(__file__).resolve().parents[2] / "examples" / "tickets"
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
ITEMS = 36
CUT_OFF = b'{"instance": "t-broken", "partition": 2, "status": "pend'


async def _ready(url: str, wait_s: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + wait_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/readyz") as resp:
                    body: dict[str, object] = await resp.json()
                    if resp.status == 200:
                        return body
            except aiohttp.ClientError:
                body = {}
            assert time.monotonic() < deadline, f"never ready: {body}"
            await asyncio.sleep(0.3)


async def test_an_unreadable_state_is_quarantined_and_every_partition_decides(
    deploy: Deploy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_PARTITIONS", "6")
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    await _ready(dep.web)
    dep.proc.stop()
    changelog = state_changelog(dep.settings)
    partition, offset = await _produce_at(dep, changelog, 2)
    assert partition == 2
    dep.proc.start()
    body = await _ready(dep.web)
    assert body["partitions"] == {str(p): {"state": "open"} for p in range(6)}, body
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    items = tickets(ITEMS)
    try:
        positions = await dep.produce_items(items)
        assert {p for p, _ in positions} == set(range(6)), positions  # every partition
        deadline = time.monotonic() + 120
        while True:
            done = {d["instance"] for d in await dep.records(dep.settings.topics.done)}
            if len(done) >= ITEMS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await worker
    assert done == {i["_instance"] for i in items}, await stuck_report(dep, TOOLS)
    letters = [
        d
        for d in await read_json(dep.bootstrap, dep.settings.topics.dead_letter)
        if d["code"] == "unreadable_state"
    ]
    assert len(letters) == 1, letters
    [letter] = letters
    assert letter["instance"] == "t-broken"
    assert letter["source"] == {"topic": changelog, "partition": 2, "offset": offset}
    assert "unreadable state record" in letter["reason"] and letter["raw_size"] == len(CUT_OFF)
    # The key's tombstone was committed with its dead letter: quarantined once.
    last = [r.value async for r in read_topic(dep.bootstrap, changelog) if r.key == b"t-broken"]
    assert last[-1] is None, last


async def _produce_at(dep: Deployment, topic: str, partition: int) -> tuple[int, int]:
    """The cut-off record, on `partition` of `topic`: where it lands, and its offset."""
    producer = AIOKafkaProducer(bootstrap_servers=dep.bootstrap, **options_for(dep.bootstrap))
    await producer.start()
    try:
        meta = await (await producer.send(topic, CUT_OFF, key=b"t-broken", partition=partition))
    finally:
        await producer.stop()
    return meta.partition, meta.offset
