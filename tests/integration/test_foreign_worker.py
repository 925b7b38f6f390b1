"""A worker written with librdkafka (tests/integration/rdkafka_worker.py, through
confluent-kafka, importing nothing of the product) answers the stateful tickets example's
awaited calls on the exactly-once runtime, end to end. Results go to the input's partition
number, as the contract says; copies written to another partition first (what a client
whose partitioner chose can do) are forwarded to their instance's partition and applied
once: each result is applied by whichever copy comes first, the other is a repeat, and
nothing is dead-lettered."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import pytest
from instanced_stream.kafka.publish import forwarded_from
from instanced_stream.kafka.topics import read_topic
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
ROOT = Path(__file__).resolve().parents[2]
TICKETS = ROOT / "examples" / "tickets" / "agent.yaml"
WORKER = Path(__file__).with_name("rdkafka_worker.py")
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
MISROUTED = 3


def test_worker_imports_nothing_of_the_product() -> None:
    source = WORKER.read_text()
    assert "instanced_stream" not in source
    assert "from confluent_kafka import" in source


async def _done(dep: Deployment, instances: set[str], wait_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    while True:
        records = await dep.records(dep.settings.topics.done)
        done = [r for r in records if r["instance"] in instances]
        if {r["instance"] for r in done} >= instances:
            return done
        assert time.monotonic() < deadline, "workflows unended:\n" + await stuck_report(dep, TOOLS)
        await asyncio.sleep(1.0)


def _start_worker(dep: Deployment, log: IO[str]) -> subprocess.Popen[bytes]:
    prefix = dep.settings.topic_prefix
    args = [dep.bootstrap, prefix, f"{prefix}rdkafka-workers", "--misroute", str(MISROUTED)]
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=log, stderr=subprocess.STDOUT
    )


async def test_librdkafka_worker_runs_the_tickets_workflow(deploy: Deploy, tmp_path: Path) -> None:
    dep = await deploy(spec_path=TICKETS, STREAM_DELIVERY="exactly_once")
    log = (tmp_path / "rdkafka-worker.log").open("w")
    worker = _start_worker(dep, log)
    items = tickets(8)
    try:
        await dep.produce_items(items)
        done = await _done(dep, {i["_instance"] for i in items}, 150)
        report = await dep.settle(len(items), 60)
    finally:
        worker.terminate()
        code = worker.wait(30)
        log.close()
        print((tmp_path / "rdkafka-worker.log").read_text()[-2000:])
    assert code == 0, "the worker did not stop cleanly on SIGTERM"
    assert report.unaccounted == 0, report.summary()
    assert report.duplicate_calls == 0
    # Every workflow ended once, after the turn that awaited the worker's two results.
    assert sorted(r["instance"] for r in done) == sorted(i["_instance"] for i in items)
    assert all(r["status"] == "done" and r["turns"] >= 2 for r in done), done
    for record in done:
        state = record["state"]
        assert state["customer"]["name"], state
        assert ("urgent" in state) != ("routine" in state), state
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert letters == [], letters
    # The misrouted copies were on the results topic and were sent on from there.
    copies = await _forwarded_results(dep)
    assert len(copies) == MISROUTED, copies


async def _forwarded_results(dep: Deployment) -> list[tuple[str, int, int]]:
    """Where each result the processor forwarded was first."""
    found = []
    async for rec in read_topic(dep.bootstrap, dep.settings.topics.results):
        origin = forwarded_from(rec.headers)
        if origin is not None:
            found.append(origin)
    return found
