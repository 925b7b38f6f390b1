"""Exactly once on the units (DESIGN.md section 8), against a real broker: processors
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
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream.ops.audit import AuditReport
from stream.runtime.security import options_for
from stream.tools.demo import ProcessorProcess
from tests.conftest import Deployment, committed_offsets

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

Deploy = Callable[..., Awaitable[Deployment]]
EO = {"STREAM_DELIVERY": "exactly_once"}


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


async def test_random_sigkills_of_two_processors(deploy: Deploy) -> None:
    """At least 20 SIGKILLs, at random moments, of two processors in one group while
    items flow (each kill also rebalances the survivor); then every input has exactly
    one outcome on the read_committed topics."""
    rng = random.Random(_seed())
    dep = await deploy(**EO)
    dep.sim.config.latency_ms = 120  # several batches in flight at every kill
    procs = [dep.proc, _second(dep, "second")]
    procs[1].start()
    kills = 0
    produced = 0
    deadline = time.monotonic() + 200
    while kills < 20:
        assert time.monotonic() < deadline, f"only {kills} kills in time"
        await dep.produce_items(_items(15, f"k{kills}"))
        produced += 15
        await asyncio.sleep(rng.uniform(0.5, 2.5))
        victim = procs[rng.randrange(2)]
        assert victim.proc is not None
        if victim.proc.poll() is None:
            victim.kill()
            assert victim.proc.returncode == -signal.SIGKILL
            kills += 1
        victim.start()
    report = await dep.settle(produced, 150)
    for proc in procs:
        proc.stop()
    print(f"{kills} kills; {report.summary()}")
    _exactly_once(report)


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
