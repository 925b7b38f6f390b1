"""Exactly once on the units (docs/architecture.md, exactly once), against a real broker: processors
that are real OS processes, SIGKILLed and rebalanced, and an independent read_committed
check over every outcome topic (`stream audit`): every input one outcome, no call_id
twice, nothing missing."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from instanced_stream.activities.worker import load_activities
from instanced_stream.kafka.security import options_for
from instanced_stream.ops.audit import AuditReport
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import (
    Deployment,
    committed_offsets,
    demo_json,
    kill_with_work,
    live_of,
    stuck_report,
    with_work,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

Deploy = Callable[..., Awaitable[Deployment]]
EO = {"STREAM_DELIVERY": "exactly_once"}
TICKETS = Path(__file__).resolve().parents[2] / "examples" / "tickets"
TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
# SIGKILLs per churn test, each counted only when it found uncommitted work (it was 20 kills
# at random moments before, many of them between batches or during a rebalance).
KILLS = int(os.environ.get("STREAM_CHAOS_KILLS") or 5)


def _items(n: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"_instance": f"{tag}-{i:04d}", "comment": f"Thanks, a useful note {tag} {i}."}
        for i in range(n)
    ]


def _seed() -> int:
    seed = int(os.environ.get("STREAM_CHAOS_SEED") or secrets.randbits(32))
    print(f"chaos seed {seed} (replay: STREAM_CHAOS_SEED={seed})")
    return seed


def _exactly_once(report: AuditReport) -> None:
    assert report.unaccounted == 0, (report.summary(), report.missing[:5])
    assert report.unexpected == 0
    assert report.duplicate_calls == 0, report.summary()
    assert report.outcomes_per_input_max == 1, report.duplicate_outcomes
    assert report.duplicate_outcomes == 0


def _second(dep: Deployment, name: str) -> ProcessorProcess:
    """Another processor of the same group (same topics and app id), its own log."""
    port = str(_port())
    env = {**dep.proc.env, "STREAM_WEB_PORT": port}
    return ProcessorProcess(env, dep.proc.log_path.with_name(f"{name}.log"))


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_items_end_once_with_one_processor(deploy: Deploy) -> None:
    dep = await deploy(**EO)
    await dep.produce_items(_items(120, "one"))
    await dep.produce([(b"bad", b"not json")])
    report = await dep.settle(121, 90)
    _exactly_once(report)
    assert report.dead_letters.get("not_json") == 1
    assert "delivery exactly_once" in dep.proc.log_path.read_text()


Step = Callable[[list[ProcessorProcess], random.Random], Awaitable[bool]]


async def _churn(
    dep: Deployment, make: Callable[[int], list[dict[str, Any]]], rounds: int, step: Step
) -> int:
    """Items produced in waves while `step` kills, stops or starts processors of one group
    between them, until `rounds` steps counted (a kill counts when its precondition held);
    returns how many items were produced."""
    rng = random.Random(_seed())
    dep.sim.config.latency_ms = 120  # several batches in flight at every step
    procs = [dep.proc, _second(dep, "second")]
    procs[1].start()
    produced, done, tried = 0, 0, 0
    deadline = time.monotonic() + 300
    try:
        while done < rounds:
            assert time.monotonic() < deadline, f"only {done} of {rounds} steps in time"
            items = make(tried)
            await dep.produce_items(items)
            produced += len(items)
            tried += 1
            done += await step(procs, rng)
        print(f"{done} steps counted of {tried} tried")
        for proc in procs:
            if proc.proc is None or proc.proc.poll() is not None:
                proc.start()  # the survivors finish what is left
        return produced
    finally:
        dep.extra = procs[1:]  # stopped with the deployment


async def _kill(procs: list[ProcessorProcess], rng: random.Random) -> bool:
    """SIGKILLs a processor (drawn at random) while it owns partitions with uncommitted
    records and a batch at the model, then restarts it. A step without such a moment
    within a few seconds kills nobody and does not count."""
    victim = procs[rng.randrange(len(procs))]
    units = await kill_with_work(victim, 15)
    if units is None:
        return False
    assert victim.proc is not None and victim.proc.returncode == -signal.SIGKILL
    print(f"SIGKILL with uncommitted records per partition {units}")
    victim.start()
    return True


async def test_random_sigkills_of_two_processors(deploy: Deploy) -> None:
    """SIGKILLs of two processors in one group while items flow, each aimed at a moment
    the victim owns partitions with uncommitted records and a batch at the model (each
    kill also rebalances the survivor); then, once nothing arrives any more, every input
    has exactly one outcome on the read_committed topics."""
    dep = await deploy(**EO)
    produced = await _churn(dep, lambda k: _items(25, f"k{k}"), KILLS, _kill)
    report = await dep.settle_quiet(produced, 150)
    print(report.summary())
    _exactly_once(report)


async def _workflows_under(dep: Deployment, tag: str, rounds: int, step: Step) -> None:
    """Tickets in waves while `step` churns the group; a worker answers the awaited calls.
    Then: exactly once on the outputs, and every workflow ended once after two turns."""
    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    made: list[dict[str, Any]] = []

    def wave(k: int) -> list[dict[str, Any]]:
        items = [{**t, "_instance": f"{tag}{k}-{t['_instance']}"} for t in tickets(8)]
        made.extend(items)
        return items

    try:
        produced = await _churn(dep, wave, rounds, step)
        report = await dep.settle_quiet(produced, 150)
        done = await _all_done(dep, {i["_instance"] for i in made}, 180)
    finally:
        stop.set()
        await worker
    _exactly_once(report)
    assert len(done) == len(made)
    for records in done.values():
        assert len(records) == 1, records  # one done record per workflow
        assert [t["turn"] for t in records[0]["trace"]] == [1, 2]  # no turn lost or redone


async def test_random_sigkills_mid_workflow(deploy: Deploy) -> None:
    """The same on the stateful tickets example (two turns, awaited calls answered by a
    worker): no turn asked twice into the outputs, every workflow ended exactly once."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml", **EO)
    await _workflows_under(dep, "w", KILLS, _kill)


async def _toggle(procs: list[ProcessorProcess], rng: random.Random) -> bool:
    """Starts the second processor while the first owns partitions with work in flight,
    or stops it (SIGTERM, a graceful leave) while it does; counts only when that held and
    the partitions moved: a started second holds some, read from its live API."""
    second = procs[1]
    if second.proc is not None and second.proc.poll() is None:
        work = await with_work(second, 15)
        await asyncio.to_thread(second.stop)
        print(f"stopped the second with uncommitted records per partition {work}")
        return work is not None
    work = await with_work(procs[0], 15)
    second.start()
    deadline = time.monotonic() + 60
    while not ((await live_of(second)) or {}).get("units"):
        assert time.monotonic() < deadline, f"the second never got partitions\n{second.tail()}"
        await asyncio.sleep(0.2)
    print(f"started the second under uncommitted records per partition {work}")
    return work is not None


async def test_scale_out_and_in_mid_workflow(deploy: Deploy) -> None:
    """A live owner losing partitions (a second processor started, later stopped with
    SIGTERM, twice each) while turns are in flight: no turn runs twice. Each move is
    counted only when work was in flight and the partitions did move (it was 8 toggles,
    some stopping a second that had not yet joined)."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml", **EO)
    await _workflows_under(dep, "s", 4, _toggle)


async def _all_done(
    dep: Deployment, instances: set[str], wait_s: float
) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + wait_s
    while True:
        done: dict[str, list[dict[str, Any]]] = {}
        for rec in await dep.records(dep.settings.topics.done):
            done.setdefault(rec["instance"], []).append(rec)
        if set(done) >= instances:
            return done
        assert time.monotonic() < deadline, (
            f"{len(instances - set(done))} workflows unended:\n" + await stuck_report(dep, TOOLS)
        )
        await asyncio.sleep(1.0)


async def test_upstream_transactions(deploy: Deploy) -> None:
    """Producers that write the input in transactions: aborted records are never decided,
    committed ones exactly once, and the commit reaches the end of the input."""
    dep = await deploy(**EO)
    producer = AIOKafkaProducer(
        bootstrap_servers=dep.bootstrap,
        transactional_id=f"upstream-{secrets.token_hex(3)}",
        **options_for(dep.bootstrap),
    )
    await producer.start()
    topic = dep.settings.topics.input
    try:
        for n in range(6):
            # a committed transaction, then (every other time) an aborted one
            async with producer.transaction():
                for item in _items(10, f"tx{n}"):
                    await producer.send(topic, orjson.dumps(item), key=str(n).encode())
            if n % 2:
                await producer.begin_transaction()
                for item in _items(10, f"ab{n}"):
                    await producer.send(topic, orjson.dumps(item), key=str(n).encode())
                await producer.abort_transaction()
    finally:
        await producer.stop()
    report = await dep.settle(60, 90)
    _exactly_once(report)
    assert report.inputs == 60  # the read_committed audit sees the committed records only
    assert not [i for i in report.instances_in_calls if i.startswith("ab")]
    ends = await _ends(dep)
    deadline = time.monotonic() + 30
    while (committed := await committed_offsets(dep.bootstrap, dep.settings)) != ends:
        assert time.monotonic() < deadline, (committed, ends)
        await asyncio.sleep(0.5)


async def _ends(dep: Deployment) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=dep.bootstrap, **options_for(dep.bootstrap))
    await consumer.start()
    try:
        tps = [TopicPartition(dep.settings.topics.input, p) for p in range(dep.settings.partitions)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items() if end > 0}


@pytest.mark.parametrize(
    ("args", "stateful"),
    [(("--items", "300"), False), (("--example", "tickets", "--items", "60"), True)],
    ids=["moderation", "tickets"],
)
def test_demo_chaos_reports_exactly_once(
    bootstrap: str, args: tuple[str, ...], stateful: bool
) -> None:
    """What a user runs (issue 24's "done when"): six SIGKILLs across two processors."""
    result = demo_json(bootstrap, *args, "--chaos", "6", timeout=300)
    assert result["unaccounted"] == 0
    assert result["chaos"]["kills_done"] == 6 and result["chaos"]["processors"] == 2
    # Each kill waits (up to 5 s) for its victim to own uncommitted records; those that
    # found it are the ones that cost a redo. With the instant simulator and a rebalance
    # after every kill, few do (1 of 6 in both examples, twice): at least one must.
    print(f"kills with uncommitted records: {result['chaos']['kills_with_work']} of 6")
    assert result["chaos"]["kills_with_work"] >= 1, result["chaos"]
    assert result["exactly_once"] == {
        "outcomes_per_input_max": 1,
        "duplicate_call_ids": 0,
        "missing": 0,
    }
    if stateful:
        assert result["workflows_unended"] == 0
        assert result["done"] == 56  # 60 items, 4 malformed on purpose
