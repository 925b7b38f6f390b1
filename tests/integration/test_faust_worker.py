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
from aiokafka.admin import AIOKafkaAdminClient
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import read_topic
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, stuck_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Deploy = Callable[..., Awaitable[Deployment]]
ROOT = Path(__file__).resolve().parents[2]
TICKETS = ROOT / "examples" / "tickets" / "agent.yaml"
WORKER = Path(__file__).with_name("faust_worker.py")
PROBE = Path(__file__).with_name("faust_probe.py")
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
    """Writes `values` to partition 0 of `topic` in one transaction, committed or aborted
    (the topic is created on first use, with the broker's default partitions)."""
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


async def _commit_lag(bootstrap: str, group: str) -> dict[str, int]:
    """End offset minus the group's committed offset, per partition it committed."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    if not committed:
        # Nothing committed yet. Also the reader below must not start and stop without
        # awaiting anything in between (as end_offsets([]) does): aiokafka's group-less
        # coordinator then cancels its task before it ever ran, and stop() raises
        # CancelledError (seen as this test's flake under load).
        return {}
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await reader.start()
    try:
        ends = await reader.end_offsets(list(committed))
    finally:
        await reader.stop()
    return {f"{tp.topic}/{tp.partition}": ends[tp] - meta.offset for tp, meta in committed.items()}


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
        # faust commits what it handled every 0.5 s (broker_commit_interval): wait for it
        # before the SIGTERM, whose own last commit faust 0.15.3 sometimes fails
        # (IllegalOperation, docs/faust.md), which would leave this check to chance.
        group = f"{dep.settings.topic_prefix}faust-workers"
        lag: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lag = await _commit_lag(dep.bootstrap, group)
            if f"{lookups}/0" in lag and set(lag.values()) <= {0, 1}:
                break
            await asyncio.sleep(0.5)
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
    # faust committed every call it handled: each partition's committed offset is its end,
    # or the one before it (a transaction's closing marker, which holds no record)
    assert f"{lookups}/0" in lag and set(lag.values()) <= {0, 1}, lag
    report = await dep.settle(len(items), 60)
    assert report.unaccounted == 0, report.summary()


def _start_probe(args: list[str], tmp: Path, log: IO[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(PROBE), *args], stdout=log, stderr=subprocess.STDOUT, cwd=tmp
    )


async def _probe(bootstrap: str, tmp: Path, guarantee: str) -> tuple[list[str], int]:
    """Runs faust_probe.py on a fresh topic holding a, x (aborted), boom, z, each its own
    transaction (offsets 0, 2, 4, 6; markers between): the call_ids its agent was handed,
    and the group's committed offset once it has handled z and committed again."""
    topic = f"faust-probe-{guarantee}-{secrets.token_hex(3)}"
    for call_id, abort in (("a", False), ("x", True), ("boom", False), ("z", False)):
        await _write(bootstrap, topic, [orjson.dumps({"call_id": call_id})], abort=abort)
    log_path = tmp / f"{topic}.log"
    with log_path.open("w") as log:
        proc = _start_probe([bootstrap, topic, topic, str(tmp / topic), guarantee], tmp, log)
        try:
            await _until(
                lambda: "seen z" in log_path.read_text(), 30, lambda: log_path.read_text()[-3000:]
            )
            # z handled; its commit is due within the 0.5 s commit interval: give it four
            await asyncio.sleep(2.0)
        finally:
            proc.terminate()
            proc.wait(30)
    lag = await _commit_lag(bootstrap, topic)
    seen = re.findall(r"\bseen (\S+)", log_path.read_text())
    return seen, 8 - lag[f"{topic}/0"]


async def test_what_faust_itself_does_with_an_aborted_call(bootstrap: str, tmp_path: Path) -> None:
    """Why the adapter requires exactly_once and acks by hand (docs/faust.md): with faust's
    default at_least_once its agent is handed the aborted call, and the call whose handler
    raised is committed anyway (acked in a `finally`, faust-streaming #189); with
    exactly_once it reads read_committed, but its committed offset stays before the
    aborted transaction, so a restart hands every later call over again."""
    (loose, loose_at), (strict, strict_at) = await asyncio.gather(
        _probe(bootstrap, tmp_path, "at_least_once"), _probe(bootstrap, tmp_path, "exactly_once")
    )
    assert loose == ["a", "x", "boom", "z"]
    assert loose_at == 7  # past boom (offset 4) and z: everything but the closing marker
    assert strict == ["a", "boom", "z"]
    assert strict_at == 1  # right after a: x's aborted transaction holds it there
