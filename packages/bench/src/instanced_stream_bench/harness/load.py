"""The load side of the benchmarks: realistic items, a producer that can pace them, and
a tally of which inputs ended (and how late) read from the outcome topics."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from instanced_stream.kafka.topics import ensure_topics

from instanced_stream_bench.harness.background import Background
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.harness.report import Result
from instanced_stream_bench.testing.samples import comments

_MIN_SPAN_S = 2.0  # outcomes spread over less than this: too few waves for a slope

__all__ = [
    "Tally",
    "TopicReader",
    "all_ready",
    "bench_items",
    "cpu_s",
    "passthrough",
    "passthrough_row",
    "produce_items",
    "rss_mb",
]


def bench_items(n: int, seed: int = 11) -> list[dict[str, str]]:
    """Comments of realistic length: one to four sentences each (about 60-400 bytes)."""
    rng = random.Random(seed)
    pool = [c["comment"] for c in comments(400, seed)]
    out = []
    for i, item in enumerate(comments(n, seed)):
        extra = " ".join(rng.choice(pool) for _ in range(rng.randint(0, 3)))
        out.append({**item, "_instance": f"b-{i:06d}", "comment": f"{item['comment']} {extra}"})
    return out


def cpu_s(pid: int) -> float | None:
    """The process's CPU time so far (user and system), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class TopicReader(Background):
    """Reads `topics` read_committed from the start in a background task while the body of
    `async with` runs, handing each fetch to `_take`: what a user's consumer sees, so an
    aborted transaction's records never count."""

    fetch_max_wait_ms = 100

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self._consumer: AIOKafkaConsumer | None = None

    async def _open(self) -> None:
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            isolation_level="read_committed",
        )
        await self._consumer.start()

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None  # opened by `_open`
        try:
            while True:
                found = await consumer.getmany(timeout_ms=200, max_records=5000)
                self._take(found, time.monotonic())
        finally:
            await consumer.stop()

    def _take(self, found: dict[Any, list[Any]], now: float) -> None:
        """One fetch's records, by topic-partition, read at `now`."""
        raise NotImplementedError


class Tally(TopicReader):
    """Reads the outcome topics as they fill: which inputs ended, and how late."""

    fetch_max_wait_ms = 50

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        super().__init__(bootstrap, topics)
        self.done: set[tuple[int, int]] = set()
        self.first_at: float | None = None
        self.last_at = 0.0
        self.latency_ms: dict[tuple[int, int], float] = {}
        self.base = 0  # outcomes before the clock (re)started
        self.restarted_at = time.monotonic()
        self.progress: list[tuple[float, int]] = []  # (when, outcomes) since the restart

    def restart(self) -> None:
        """Starts the throughput clock afresh at the next outcome."""
        self.base = len(self.done)
        self.first_at = None
        self.progress = []
        self.restarted_at = time.monotonic()

    def _take(self, found: dict[Any, list[Any]], now: float) -> None:
        for records in found.values():
            for rec in records:
                self._count(rec, now)
        if found and self.first_at is not None:
            self.progress.append((now, len(self.done)))

    def _count(self, rec: Any, now: float) -> None:
        try:
            source = orjson.loads(rec.value)["source"]
            key = (int(source["partition"]), int(source["offset"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return
        if key in self.done:
            return
        self.done.add(key)
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        produced = source.get("timestamp_ms")
        if produced:
            # Until a read_committed consumer sees the outcome, not the output record's own
            # timestamp: under exactly once a record is written before its commit.
            self.latency_ms[key] = int(time.time() * 1000) - produced

    def rate(self) -> float:
        """Items/s at steady state: the least-squares slope of outcomes over time, from
        the first outcome on. Outcomes arrive in waves of whole batches; a slope over
        all of them is not skewed by where the first and the last wave fall."""
        points = self.progress
        if len(points) < 2:
            return 0.0
        if points[-1][0] - points[0][0] < _MIN_SPAN_S:
            # Everything landed in one or two waves (a slow endpoint, few items): a slope
            # over milliseconds means nothing; count from when the items were produced.
            return (points[-1][1] - self.base) / max(points[-1][0] - self.restarted_at, 1e-6)
        t0 = points[0][0]
        xs = [t - t0 for t, _ in points]
        ys = [float(n) for _, n in points]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        if var == 0:
            return 0.0
        return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var

    async def wait_for(
        self,
        count: int,
        cap_s: float,
        proc: list[ProcessorProcess],
        since: float | None = None,
    ) -> bool:
        """Until `count` inputs ended, or `cap_s` after `since` (default: the first
        outcome); True if it gave up."""
        started = time.monotonic()
        while len(self.done) < count:
            for p in proc:
                if p.proc is not None and p.proc.poll() is not None:
                    raise RuntimeError(f"processor exited:\n{p.tail()}")
            now = time.monotonic()
            if self.first_at is None and now - started > 180:
                raise RuntimeError(f"no outcome within 180 s:\n{proc[0].tail()}")
            origin = since if since is not None else self.first_at
            if origin is not None and now - origin > cap_s:
                return True
            await asyncio.sleep(0.1)
        return False


async def produce_items(
    bootstrap: str, topic: str, items: list[dict[str, str]], rate: float | None = None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        started = time.monotonic()
        futures = []
        for i, item in enumerate(items):
            if rate:
                ahead = started + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            futures.append(
                await producer.send(
                    topic,
                    orjson.dumps(item),
                    key=item["_instance"].encode(),
                    timestamp_ms=int(time.time() * 1000),
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def passthrough(bootstrap: str, src: str, dst: str, count: int) -> tuple[int, float]:
    """A raw aiokafka consume-and-produce of `count` records (acks=all, idempotent): what
    the machine moves with no processing at all. Returns (records, seconds)."""
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=dst + ".passthrough",
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=1000,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await consumer.start()
    await producer.start()
    moved = 0
    first: float | None = None
    try:
        while moved < count:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            if first is None and batches:
                first = time.monotonic()
            futures = [
                await producer.send(dst, rec.value, key=rec.key)
                for records in batches.values()
                for rec in records
            ]
            await asyncio.gather(*futures)
            moved += len(futures)
    finally:
        await consumer.stop()
        await producer.stop()
    return moved, time.monotonic() - (first or time.monotonic())


async def all_ready(procs: list[ProcessorProcess], wait_s: float = 120) -> None:
    """Until every processor owns its partitions and none is rebalancing (/readyz), twice
    in a row: a member joining late would stop the others mid-measurement."""
    deadline = time.monotonic() + wait_s
    steady = 0
    async with aiohttp.ClientSession() as http:
        while steady < 2 and time.monotonic() < deadline:
            ready = 0
            for proc in procs:
                try:
                    url = f"http://127.0.0.1:{proc.env['STREAM_WEB_PORT']}/readyz"
                    async with http.get(url) as resp:
                        ready += resp.status == 200
                except aiohttp.ClientError:
                    pass
            steady = steady + 1 if ready == len(procs) else 0
            await asyncio.sleep(1.0)


async def passthrough_row(
    bootstrap: str, items: list[dict[str, str]], partitions: int, runs: int
) -> Result:
    """The passthrough's row: the median of `runs` passes over fresh topics."""
    prefix = f"bench-{secrets.token_hex(3)}."
    src, dsts = prefix + "items", [f"{prefix}copy{i}" for i in range(runs)]
    await ensure_topics(bootstrap, [src, *dsts], partitions)
    await produce_items(bootstrap, src, items)
    passes = sorted(
        [await passthrough(bootstrap, src, dst, len(items)) for dst in dsts],
        key=lambda p: p[0] / max(p[1], 1e-9),
    )
    moved, seconds = passes[len(passes) // 2]
    result = Result("aiokafka passthrough", None, 1, partitions, moved, seconds, moved / seconds)
    rates = ", ".join(f"{m / s:,.0f}" for m, s in passes)
    result.notes.append(f"median of {runs} passes ({rates} items/s)")
    return result
