"""The console operations against a real broker, each test on its own topic prefix."""

from __future__ import annotations

import asyncio
import io
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import StreamError
from instanced_stream.kafka.topics import ensure_product_topics, product_topics, read_topic
from instanced_stream.ops.console import produce, render_topics, resolve_topic, topics
from instanced_stream.ops.tail import tail
from instanced_stream.settings import Settings
from instanced_stream_bench.testing.samples import comments

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LINES = [
    b'{"_instance": "c-1", "comment": "first"}',
    b'{"_instance": "c-2", "comment": "second"}',
    b"{oops",
    b"",
    b'{"comment": "anonymous"}',
    b'{"_instance": "c-3", "comment": "third"}',
]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _settings(bootstrap: str) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap, topic_prefix=f"c{secrets.token_hex(3)}.", partitions=2
    )


async def _topic_names(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _produced(bootstrap: str, tmp_path: Path) -> tuple[Settings, AgentSpec]:
    settings = _settings(bootstrap)
    spec = load_spec(settings.spec)
    await ensure_product_topics(bootstrap, settings, spec)
    # The broker lists a new topic a moment after creating it.
    wanted = {*product_topics(settings, spec), settings.topics.context}
    deadline = time.monotonic() + 20
    while not wanted <= await _topic_names(bootstrap):
        assert time.monotonic() < deadline, "created topics never listed"
        await asyncio.sleep(0.2)
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    out = io.StringIO()
    # 20/s spaces the records 50 ms apart: distinct timestamps, a deterministic tail order
    report = await produce(bootstrap, settings.topics.input, path, rate=20, out=out)
    assert (report.sent, report.invalid, report.without_key) == (4, 1, 1)
    assert [n for n, _ in report.invalid_lines] == [3]
    assert report.invalid_lines[0][1].startswith("not JSON")
    assert report.elapsed_s >= 0.15  # three gaps of 50 ms
    assert report.rate == pytest.approx(4 / report.elapsed_s)
    summary = out.getvalue()
    assert summary.count("\n") == 1 and "\r" not in summary  # not a tty: one summary line
    assert summary.startswith(f"sent 4 records to {settings.topics.input}")
    assert "1 without a key" in summary and "dead-letters" in summary
    assert "NOT SENT: 1 invalid line (line 3: not JSON" in summary
    return settings, spec


async def test_produce_sends_valid_lines_with_their_keys(bootstrap: str, tmp_path: Path) -> None:
    settings, _ = await _produced(bootstrap, tmp_path)
    got = [rec async for rec in read_topic(bootstrap, settings.topics.input)]
    assert sorted((r.key or b"", r.value) for r in got) == [
        (b"", LINES[4]),
        (b"c-1", LINES[0]),
        (b"c-2", LINES[1]),
        (b"c-3", LINES[5]),
    ]


async def test_tail_prints_the_last_records_then_follows(bootstrap: str, tmp_path: Path) -> None:
    settings, _ = await _produced(bootstrap, tmp_path)
    topic = resolve_topic(settings, "items")
    out = io.StringIO()
    assert await tail(bootstrap, topic, last=2, out=out) == 2
    first, second = out.getvalue().splitlines()
    assert first.endswith('  -  {"comment":"anonymous"}')
    assert second.endswith('  c-3  {"_instance":"c-3","comment":"third"}')
    raw = io.StringIO()
    assert await tail(bootstrap, topic, last=10, as_json=True, out=raw) == 4
    values = [orjson.loads(line)["value"] for line in raw.getvalue().splitlines()]
    assert values == [orjson.loads(LINES[i]) for i in (0, 1, 4, 5)]

    live = io.StringIO()
    task = asyncio.create_task(tail(bootstrap, topic, follow=True, last=1, out=live))
    await _until(lambda: "c-3" in live.getvalue())
    more = tmp_path / "more.jsonl"
    more.write_bytes(b'{"_instance": "c-4", "comment": "late"}\n')
    terminal = _Terminal()
    await produce(bootstrap, topic, more, out=terminal)
    # on a terminal the summary overwrites the progress line
    assert terminal.getvalue().startswith("\r\x1b[Ksent 1 record to")
    await _until(lambda: "c-4" in live.getvalue())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [line.split()[3] for line in live.getvalue().splitlines()] == ["c-3", "c-4"]


async def test_tail_of_a_missing_topic_fails_without_creating_it(bootstrap: str) -> None:
    missing = f"c{secrets.token_hex(3)}.nothing"
    with pytest.raises(StreamError, match=f"topic {missing} does not exist"):
        await tail(bootstrap, missing, out=io.StringIO())
    with pytest.raises(StreamError, match="does not exist"):
        await produce(bootstrap, missing, Path(__file__), out=io.StringIO())
    assert missing not in await _topic_names(bootstrap)


async def test_topics_shows_records_and_lag(bootstrap: str, tmp_path: Path) -> None:
    settings, spec = await _produced(bootstrap, tmp_path)
    source, group = settings.topics.input, settings.topic_prefix + settings.app_id
    rows = {r.name: r for r in await topics(bootstrap, settings, spec)}
    row = rows[source]
    assert (row.partitions, row.records, row.group, row.committed) == (2, 4, group, None)
    assert sum(row.lag.values()) == 4 and len(row.lag) == 2
    assert rows[settings.topics.context].partitions == 1
    assert rows[settings.topics.dead_letter].records == 0
    assert not any(r.created for r in rows.values())
    assert f"no group {group} yet" in render_topics(list(rows.values()))

    # The processors' group commits one record of the fuller partition: lag drops by one.
    partition = max(row.lag, key=lambda p: row.lag[p])
    # no auto-commit: its commit on stop would overwrite the one this test makes
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(source, partition)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(1, "")})
    finally:
        await consumer.stop()
    after = next(r for r in await topics(bootstrap, settings, spec) if r.name == source)
    assert after.committed == {partition: 1}
    assert after.lag[partition] == row.lag[partition] - 1
    assert sum(after.lag.values()) == 3
    assert f"group {group}, lag by partition" in render_topics([after])


async def test_topics_create_with_partitions(bootstrap: str) -> None:
    settings = _settings(bootstrap)
    spec = load_spec(settings.spec)
    before = await topics(bootstrap, settings, spec)
    assert {r.partitions for r in before} == {0}
    assert "missing" in render_topics(before)
    assert settings.topics.input not in await _topic_names(bootstrap)  # looking creates nothing
    rows = {r.name: r for r in await topics(bootstrap, settings, spec, create=True, partitions=3)}
    assert all(r.created for r in rows.values())
    assert rows[settings.topics.input].partitions == 3
    assert rows[settings.topics.activity("moderateComment")].partitions == 3
    assert rows[settings.topics.context].partitions == 1  # compacted, read in order
    again = await topics(bootstrap, settings, spec, create=True, partitions=5)
    assert not any(r.created for r in again)  # existing topics are left alone
    assert next(r for r in again if r.name == settings.topics.input).partitions == 3


async def test_unreachable_broker_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"  # free once closed: nobody listens
    path = tmp_path / "one.jsonl"
    path.write_bytes(LINES[0])
    started = time.monotonic()
    with pytest.raises(StreamError, match=f"cannot reach Kafka at {address}"):
        await produce(address, "items", path, out=io.StringIO())
    with pytest.raises(StreamError, match=f"cannot reach Kafka at {address}"):
        await tail(address, "items", out=io.StringIO())
    assert time.monotonic() - started < 30


async def _until(check: Callable[[], bool], wait_s: float = 20) -> None:
    deadline = time.monotonic() + wait_s
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.1)


async def test_tail_and_topics_count_records_on_an_exactly_once_topic(
    deploy: Callable[..., Awaitable[Deployment]],
) -> None:
    """An exactly-once processor's dead letters: every transaction ends in a commit marker
    (the topic's last offset holds no record), so `--last` and `stream topics` must count
    records, not offsets."""
    dep = await deploy(STREAM_DELIVERY="exactly_once")
    await dep.produce_items(comments(6))
    await dep.produce([(f"bad-{i}".encode(), b"{oops") for i in range(3)])
    report = await dep.settle(9)
    assert report.unaccounted == 0, report.summary()
    topic = resolve_topic(dep.settings, "deadletter")
    letters = await dep.records(topic)  # read_committed: the truth
    assert len(letters) == 3
    consumer = AIOKafkaConsumer(bootstrap_servers=dep.bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(dep.settings.partitions)]
        offsets = sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()
    assert offsets > 3  # markers: an offset count would be wrong here
    took = []
    for _ in range(3):
        out = io.StringIO()
        started = time.monotonic()
        assert await asyncio.wait_for(tail(dep.bootstrap, topic, last=1, out=out), 10) == 1
        took.append(time.monotonic() - started)
    assert min(took) < 1.0, took
    newest = out.getvalue().strip()
    assert "deadletter code=not_json" in newest
    three = io.StringIO()
    assert await tail(dep.bootstrap, topic, last=3, out=three) == 3
    assert three.getvalue().splitlines()[-1] == newest
    assert await tail(dep.bootstrap, topic, last=10, out=io.StringIO()) == 3
    rows = {r.name: r for r in await topics(dep.bootstrap, dep.settings, dep.spec)}
    assert (rows[topic].records, rows[topic].exact) == (3, True)
    assert rows[dep.settings.topics.input].records == 9
    cli = await dep.cli("tail", "deadletter", "--last", "1")
    assert cli.returncode == 0, cli.stderr[-1500:]
    assert len(cli.stdout.splitlines()) == 1 and "not_json" in cli.stdout
    # redrive says what it left out and why, rather than a bare "would send 0"
    dry = await dep.cli("redrive", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-1500:]
    assert "redrive: would send 0, skipped 0" in dry.stdout
    assert "redrive: left out 3 dead letters: not_json 3 (codes that fail" in dry.stdout
