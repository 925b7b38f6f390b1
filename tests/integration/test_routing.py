"""A stateful instance lives on one partition (runtime/pipeline/admission.py, `forwarded`):
inputs a producer wrote to another partition (keyless records naming `_instance`, an
explicit partition) are sent on, exactly once, to the partition the instance id keys
to, so each instance's state changes only in one unit's transactions. Before, the
second input of a finished instance on another partition split its state between two
stores and its workflow never ended (issue 44)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from instanced_stream.activities.worker import load_activities
from instanced_stream.kafka.publish import home_partition
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import read_topic, state_changelog
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = Path(__file__).resolve().parents[2] / "examples" / "tickets"
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]


async def _send_elsewhere(dep: Deployment, items: list[dict[str, str]], shift: int) -> None:
    """Each item keyless, on the partition `shift` after its instance's own."""
    n = dep.settings.partitions
    producer = AIOKafkaProducer(bootstrap_servers=dep.bootstrap, **options_for(dep.bootstrap))
    await producer.start()
    try:
        for item in items:
            home = home_partition(item["_instance"], n)
            await producer.send_and_wait(
                dep.settings.topics.input, orjson.dumps(item), partition=(home + shift) % n
            )
    finally:
        await producer.stop()


async def _ended(dep: Deployment, instances: set[str], times: int, wait_s: float) -> float:
    """Until every instance's workflow ended `times` times; the seconds it took."""
    started = time.monotonic()
    while True:
        done = await dep.records(dep.settings.topics.done)
        counts = {i: sum(1 for r in done if r["instance"] == i) for i in instances}
        if all(c >= times for c in counts.values()):
            return time.monotonic() - started
        waited = time.monotonic() - started
        assert waited < wait_s, f"{counts}\n" + await stuck_report(dep, TOOLS)
        await asyncio.sleep(1.0)


async def test_inputs_on_other_partitions_are_forwarded_to_their_instance(
    deploy: Deploy,
) -> None:
    dep = await deploy(spec_path=TICKETS / "agent.yaml", STREAM_DELIVERY="exactly_once")
    n = dep.settings.partitions
    assert n > 2
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    first = tickets(6)
    ids = {t["_instance"] for t in first}
    try:
        await _send_elsewhere(dep, first, shift=1)
        took = await _ended(dep, ids, 1, 120)
        # A new input of each finished instance, on yet another partition.
        again = [{**t, "subject": "still broken"} for t in first]
        await _send_elsewhere(dep, again, shift=2)
        took2 = await _ended(dep, ids, 2, 120)
    finally:
        stop.set()
        await worker
    print(f"first workflows ended in {took:.1f} s, the second ones in {took2:.1f} s")
    places: dict[str, set[int]] = {}
    async for rec in read_topic(dep.bootstrap, state_changelog(dep.settings)):
        if rec.key is not None:
            places.setdefault(rec.key.decode(), set()).add(rec.partition)
    assert set(places) >= ids
    for instance in ids:
        assert places[instance] == {home_partition(instance, n)}, (instance, places[instance])
    # Each forwarded copy stands for its original (the audit takes it as a re-drive).
    report = await dep.settle_quiet(len(first) + len(again), 90)
    assert report.redriven == len(first) + len(again)
    assert report.duplicate_calls == 0
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert letters == [], letters
