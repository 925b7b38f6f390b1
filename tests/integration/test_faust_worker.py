"""A faust-streaming app answers the tickets example's awaited calls through
`instanced_stream.activities.faust_agent` (tests/integration/faust_worker.py, its own
process), beside the librdkafka worker of test_foreign_worker.py, on the exactly-once
runtime: every workflow ends, each call is handled once and answered once on its input's
partition, redelivered calls (same `call_id`) are dropped, and a call from an aborted
transaction is never handed to a handler."""

from __future__ import annotations

import asyncio
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import read_topic
from instanced_stream.testing.samples import tickets
from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Deploy = Callable[..., Awaitable[Deployment]]
ROOT = Path(__file__).resolve().parents[2]
TICKETS = ROOT / "examples" / "tickets" / "agent.yaml"
WORKER = Path(__file__).with_name("faust_worker.py")
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
HANDLED = re.compile(r"\bhandled (\S+)")
REDELIVERED = 3


def _start_worker(dep: Deployment, tmp: Path, log: IO[str]) -> subprocess.Popen[bytes]:
    prefix = dep.settings.topic_prefix
    args = [dep.bootstrap, prefix, f"{prefix}faust-workers", str(tmp / "faust-data")]
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=log, stderr=subprocess.STDOUT, cwd=tmp
    )


def _handled(log_path: Path) -> Counter[str]:
    return Counter(HANDLED.findall(log_path.read_text()))


async def _until(what: Callable[[], bool], wait_s: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + wait_s
    while not what():
        assert time.monotonic() < deadline, why()
        await asyncio.sleep(0.3)


async def _write(bootstrap: str, topic: str, values: list[bytes], *, abort: bool = False) -> None:
    """Writes `values` to partition 0 of `topic` in one transaction, committed or aborted."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"test-writer-{secrets.token_hex(3)}",
        **options_for(bootstrap),
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for value in values:
            await (await producer.send(topic, value, partition=0))
        if abort:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
    finally:
        await producer.stop()


async def _uncommitted_call_ids(bootstrap: str, topic: str) -> list[str]:
    """What a read_uncommitted reader finds on partition 0 (aborted records included)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_uncommitted", **options_for(bootstrap)
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        found: list[str] = []
        while await consumer.position(tp) < end:
            for rec in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                found.append(orjson.loads(rec.value or b"{}")["call_id"])
        return found
    finally:
        await consumer.stop()


def _fire_and_forget(record: dict[str, Any], call_id: str) -> bytes:
    """A copy of an activity record under a new call_id, with no result awaited."""
    call = {k: v for k, v in record["call"].items() if k != "_outputPath"}
    return orjson.dumps({**record, "call_id": call_id, "call": call})


async def test_a_faust_app_answers_the_tickets_workflow(deploy: Deploy, tmp_path: Path) -> None:
    dep = await deploy(spec_path=TICKETS, STREAM_DELIVERY="exactly_once")
    log_path = tmp_path / "faust-worker.log"
    log = log_path.open("w")
    worker = _start_worker(dep, tmp_path, log)
    items = tickets(6)
    instances = {str(i["_instance"]) for i in items}
    lookups = dep.activity_topic("lookupCustomer")
    try:
        await dep.produce_items(items)
        done: list[dict[str, Any]] = []

        async def ended() -> bool:
            done[:] = [
                r for r in await dep.records(dep.settings.topics.done) if r["instance"] in instances
            ]
            return {r["instance"] for r in done} >= instances

        deadline = time.monotonic() + 60
        while not await ended():
            assert time.monotonic() < deadline, "unended:\n" + await stuck_report(dep, TOOLS)
            await asyncio.sleep(0.5)
        calls = await dep.records(lookups)
        # Redeliveries of answered calls, a call in an aborted transaction, then a marker,
        # all on partition 0 of one topic: a partition is read in order, so once the
        # marker is handled the agent has been handed (or spared) everything before it.
        aborted_id, marker_id = f"aborted/{secrets.token_hex(3)}", f"marker/{secrets.token_hex(3)}"
        copies = [orjson.dumps(r) for r in calls[:REDELIVERED]]
        await _write(dep.bootstrap, lookups, copies)
        await _write(dep.bootstrap, lookups, [_fire_and_forget(calls[0], aborted_id)], abort=True)
        await _write(dep.bootstrap, lookups, [_fire_and_forget(calls[0], marker_id)])
        await _until(
            lambda: marker_id in _handled(log_path),
            30,
            lambda: "marker never handled:\n" + log_path.read_text()[-3000:],
        )
        on_log = await _uncommitted_call_ids(dep.bootstrap, lookups)
    finally:
        worker.terminate()
        code = worker.wait(30)
        log.close()
        print(log_path.read_text()[-3000:])
    assert code == 0, "the faust worker did not stop cleanly on SIGTERM"
    handled = _handled(log_path)
    # every workflow ended, after the turn that awaited the faust app's two results
    assert sorted(r["instance"] for r in done) == sorted(instances)
    assert all(r["status"] == "done" and r["turns"] >= 2 for r in done), done
    for record in done:
        assert record["state"]["customer"]["name"], record
        assert ("urgent" in record["state"]) != ("routine" in record["state"]), record
    # each call handled once, the redelivered ones included, and answered once
    assert {c for c, n in handled.items() if n > 1} == set(), handled
    redelivered = [r["call_id"] for r in calls[:REDELIVERED]]
    assert all(handled[c] == 1 for c in redelivered), handled
    results = await dep.records(dep.settings.topics.results)
    answered = Counter(r["call_id"] for r in results)
    awaited = {c for c in handled if c.split("/")[-2] in ("lookupCustomer", "assessUrgency")}
    assert set(answered) == awaited and set(answered.values()) == {1}, answered
    # ... on its input's partition (the processor refuses others: no dead letter at all)
    async for rec in read_topic(dep.bootstrap, dep.settings.topics.results):
        source = orjson.loads(rec.value or b"{}")["source"]
        assert rec.partition == source["partition"], (rec.partition, source)
    assert await dep.records(dep.settings.topics.dead_letter) == []
    # the aborted call reached the log (a read_uncommitted reader finds it) and never
    # the agent, which went on past it to the marker
    assert aborted_id in on_log and marker_id in on_log
    assert handled[aborted_id] == 0 and handled[marker_id] == 1
    report = await dep.settle(len(items), 60)
    assert report.unaccounted == 0, report.summary()
