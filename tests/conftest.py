from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from instanced_stream.core.spec import AgentSpec
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import partitions, read_json, read_topic, state_changelog
from instanced_stream.ops.audit import AuditReport
from instanced_stream.settings import Settings
from instanced_stream_bench.harness.demo import ProcessorProcess, launch_processor, wait_accounted
from instanced_stream_bench.harness.warm_start import ENV
from instanced_stream_bench.testing.broker import kafka_bootstrap
from instanced_stream_bench.testing.sim.server import Faults, Simulator, running_simulator

# The xdist groups hook, in its own module for its own test (tests/unit/test_xdist_groups.py).
from tests.xdist_groups import pytest_collection_modifyitems  # noqa: F401

# Processors fork from a warm interpreter (harness/warm_start.py): the same `stream process`
# in its own process, without the 2-3 s of imports each of the suite's hundreds of starts
# paid. Set before anything starts, so a `stream demo` or bench run by a test inherits it.
os.environ.setdefault(ENV, "1")

# How long no outcome may arrive before a report says "no duplicates" (settle_quiet).
QUIET_S = 2.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Where the xdist controller tells its workers the broker it started for all of them.
_SHARED_BROKER = "INSTANCED_STREAM_BENCH_SHARED_BROKER"
_UNIT = Path(__file__).resolve().parent / "unit"


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the controller starts one broker for all its workers: each worker
    starting its own costs a JVM's start and its idle CPU per worker, on two cores. Not
    for the unit tests alone (they need none), nor when a broker is configured."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if Settings().bootstrap_servers or os.environ.get(_SHARED_BROKER):
        return
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if paths and all(path.is_relative_to(_UNIT) for path in paths):
        return
    stack = ExitStack()
    os.environ[_SHARED_BROKER] = stack.enter_context(kafka_bootstrap())
    config.add_cleanup(stack.close)


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """A real Kafka broker: configured, the one the xdist controller started for every
    worker, or started here. Never skipped."""
    with kafka_bootstrap(Settings().bootstrap_servers or os.environ.get(_SHARED_BROKER)) as address:
        yield address


@pytest.fixture(scope="session")
def simulator() -> Iterator[tuple[Simulator, str]]:
    with running_simulator() as sim:
        yield sim


@dataclass
class Deployment:
    """One processor process on its own topics (fresh prefix), against the shared broker."""

    bootstrap: str
    settings: Settings
    spec: AgentSpec
    sim: Simulator
    proc: ProcessorProcess
    web: str = ""
    positions: list[tuple[int, int]] = field(default_factory=list)
    extra: list[ProcessorProcess] = field(default_factory=list)  # more of the same group

    async def produce_to(
        self, topic: str, records: list[tuple[bytes | None, bytes | None]]
    ) -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", **options_for(self.bootstrap)
        )
        await producer.start()
        try:
            futs = [await producer.send(topic, v, key=k) for k, v in records]
            metas = await asyncio.gather(*futs)
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in metas]

    async def produce(self, records: list[tuple[bytes | None, bytes]]) -> list[tuple[int, int]]:
        got = await self.produce_to(self.settings.topics.input, list(records))
        self.positions += got
        return got

    async def produce_items(self, items: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return await self.produce([(str(i["_instance"]).encode(), orjson.dumps(i)) for i in items])

    async def settle(self, expected: int, wait_s: float = 90) -> AuditReport:
        return await wait_accounted(
            self.bootstrap, self.settings, self.spec, expected, wait_s, self.proc
        )

    async def settle_quiet(
        self,
        expected: int,
        wait_s: float = 90,
        quiet_s: float = QUIET_S,
        watch: ProcessorProcess | None = None,
    ) -> AuditReport:
        """`settle`, then until the group has committed to the end of every topic it reads
        and no outcome arrived for `quiet_s`: only such a report may say "no duplicates"
        (a redo still under way would add them after an early look). `watch`: the
        processor whose exit fails the wait (the deployment's own by default)."""
        deadline = time.monotonic() + wait_s
        proc = watch or self.proc

        async def accounted() -> AuditReport:
            left = max(deadline - time.monotonic(), 1)
            return await wait_accounted(
                self.bootstrap, self.settings, self.spec, expected, left, proc
            )

        report = await accounted()
        while True:
            if await caught_up(self.bootstrap, self.settings):
                await asyncio.sleep(quiet_s)
                again = await accounted()
                # (not `==`: the instance list follows the read order across partitions)
                if again.model_dump() == report.model_dump():
                    return again
                report = again
            else:
                await asyncio.sleep(0.5)
            assert time.monotonic() < deadline, f"never quiet: {report.summary()}"

    async def records(self, topic: str) -> list[dict[str, Any]]:
        return await read_json(self.bootstrap, topic)

    async def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`stream ARGS` as a user runs it, against this deployment's broker and topics."""
        full = {
            **os.environ,
            "STREAM_BOOTSTRAP_SERVERS": self.bootstrap,
            "STREAM_TOPIC_PREFIX": self.settings.topic_prefix,
            **env,
        }
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "instanced_stream", *args],
            env=full,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def activity_topic(self, tool: str) -> str:
        return self.settings.topics.activity(tool)


@pytest_asyncio.fixture
async def deploy(
    bootstrap: str, simulator: tuple[Simulator, str]
) -> AsyncIterator[Callable[..., Awaitable[Deployment]]]:
    """Factory: start a processor on fresh topics; stopped (and its log shown) at the end."""
    sim, url = simulator
    fresh = {"faults": Faults(), "latency_ms": 0.0, "plan_order": "mixed"}
    sim.config = sim.config.model_copy(update=fresh)
    started: list[Deployment] = []

    async def make(spec_path: Path | None = None, **env: str) -> Deployment:
        port = _free_port()
        settings, spec, proc = await launch_processor(
            bootstrap,
            url,
            f"t{secrets.token_hex(4)}.",
            "stream-test-",
            spec_path,
            # a test may name the processor's own web host and port (the defaults)
            **{
                "STREAM_WEB_HOST": "127.0.0.1",
                "STREAM_WEB_PORT": str(port),
                "STREAM_SESSION_TIMEOUT_S": "6",
                **env,
            },
        )
        port = int(proc.env["STREAM_WEB_PORT"])
        dep = Deployment(bootstrap, settings, spec, sim, proc, web=f"http://127.0.0.1:{port}")
        started.append(dep)
        return dep

    yield make
    for dep in started:
        dep.proc.stop()
        for more in dep.extra:
            more.stop()
        print(f"--- processor log {dep.proc.log_path} (tail) ---\n{dep.proc.tail(15)}")
    # The simulator is shared by the session: a test that slowed it (or chose the order
    # of its plans) must not change the next.
    sim.config = sim.config.model_copy(update=fresh)


async def caught_up(bootstrap: str, settings: Settings) -> bool:
    """The group committed every record of the topics it reads (input, results, approvals):
    nothing is left for anyone to redo."""
    topics = [settings.topics.input, settings.topics.results, settings.topics.approvals]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    await consumer.start()
    try:
        group = settings.topic_prefix + settings.app_id
        done = {
            tp: meta.offset for tp, meta in (await admin.list_consumer_group_offsets(group)).items()
        }
        tps = [TopicPartition(t, p) for t in topics for p in await partitions(bootstrap, t)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
        await admin.close()
    return all(done.get(tp, 0) >= end for tp, end in ends.items() if end > 0)


async def committed_offsets(bootstrap: str, settings: Settings) -> dict[int, int]:
    """The processors' committed offsets on the input topic, by partition."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.topic_prefix + settings.app_id)
    finally:
        await admin.close()
    return {
        tp.partition: meta.offset
        for tp, meta in offsets.items()
        if tp.topic == settings.topics.input and meta.offset >= 0
    }


async def workflow_states(dep: Deployment) -> dict[str, dict[str, Any]]:
    """The state table as its changelog holds it (latest record per instance)."""
    latest: dict[str, dict[str, Any]] = {}
    async for rec in read_topic(dep.bootstrap, state_changelog(dep.settings)):
        if rec.key and rec.value:
            latest[rec.key.decode()] = orjson.loads(rec.value)
    return latest


def demo_json(bootstrap: str, *args: str, timeout: float) -> dict[str, Any]:
    """`stream demo ARGS --json` as a user runs it against this broker: its summary."""
    done = subprocess.run(
        [sys.executable, "-m", "instanced_stream", "demo", *args, "--json"],
        env={**os.environ, "STREAM_BOOTSTRAP_SERVERS": bootstrap},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return summary


async def stuck_report(dep: Deployment, tools: list[str]) -> str:
    """What a stuck stateful run looked like: records per topic, each workflow's last
    state, the result call_ids seen, and the processor's log."""
    results = await dep.records(dep.settings.topics.results)
    counts = {dep.settings.topics.results: len(results)}
    counts |= {t: len(await dep.records(t)) for t in map(dep.activity_topic, tools)}
    states = {
        k: (st["status"], st["turn"], sorted(st["pending"]))
        for k, st in (await workflow_states(dep)).items()
    }
    seen = sorted((r["instance"], r["call_id"].split("/", 1)[1]) for r in results)
    if dep.proc.proc is not None and dep.proc.proc.poll() is None:
        dep.proc.proc.send_signal(signal.SIGUSR1)  # the processor logs every task's stack
        await asyncio.sleep(2)
    return f"records {counts}; states {states}; results {seen}\n{dep.proc.tail(400)}"


def web_of(proc: ProcessorProcess) -> str:
    return f"http://127.0.0.1:{proc.env['STREAM_WEB_PORT']}"


async def live_of(proc: ProcessorProcess) -> dict[str, Any] | None:
    """The processor's /api/live, or None while it is not serving."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
            http.get(f"{web_of(proc)}/api/live") as resp,
        ):
            live: dict[str, Any] = await resp.json()
            return live
    except (aiohttp.ClientError, TimeoutError):
        return None


async def with_work(proc: ProcessorProcess, wait_s: float = 30) -> dict[str, int] | None:
    """As soon as `proc`'s live API shows it owning a partition with consumed records not
    yet committed and a batch at the model: those units (per partition, the records). None
    when it had no such work within `wait_s`, or is not running."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        live = await live_of(proc)
        if proc.proc is None or proc.proc.poll() is not None:
            return None
        if live and live["in_flight"] > 0 and sum(live.get("units", {}).values()) > 0:
            units: dict[str, int] = live["units"]
            return units
        await asyncio.sleep(0.05)
    return None


async def kill_with_work(proc: ProcessorProcess, wait_s: float = 30) -> dict[str, int] | None:
    """SIGKILLs `proc` once it has work that a kill must cost (`with_work`): returns that
    work (the precondition held, for the test to count), or None, killing nobody."""
    units = await with_work(proc, wait_s)
    if units is not None:
        proc.kill()  # milliseconds after the reading: the batch is still at the model
    return units
