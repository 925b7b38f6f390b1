"""`stream activities` as people run it: two teams' workers (`--group`; one of them
without the processor's spec, `--no-spec`) each get every call; SIGTERM finishes,
commits and exits 0."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.topics import ensure_product_topics
from instanced_stream.settings import Settings

from tests.conftest import _free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moderation" / "activities.py"
CALLS = 12


def _record(i: int) -> bytes:
    return orjson.dumps(
        {
            "call_id": f"items/0/{i}/moderateComment/0",
            "tool": "moderateComment",
            "instance": f"c-{i}",
            "call": {"_tool": "moderateComment", "_instance": f"c-{i}", "decision": "approve"},
            "source": {"topic": "items", "partition": 0, "offset": i},
            "batch": {"id": "b", "size": CALLS, "token": "①", "attempt": 1},
            "model": "m",
        }
    )


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic)


async def test_two_groups_each_get_every_call_and_sigterm_commits(
    bootstrap: str, tmp_path: Path
) -> None:
    settings = Settings(bootstrap_servers=bootstrap, topic_prefix=f"w{secrets.token_hex(3)}.")
    await ensure_product_topics(bootstrap, settings, load_spec(settings.spec))
    topic = settings.topics.activity("moderateComment")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(CALLS):
            await producer.send_and_wait(topic, _record(i), key=f"c-{i}".encode())
    finally:
        await producer.stop()
    workers = {}
    for team in ("team-a", "team-b"):
        env = {
            **os.environ,
            "STREAM_BOOTSTRAP_SERVERS": bootstrap,
            "STREAM_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_DECISIONS_FILE": str(tmp_path / f"{team}.jsonl"),
            "STREAM_WEB_HOST": "127.0.0.1",
        }
        command = [sys.executable, "-m", "instanced_stream", "activities", str(EXAMPLE), "--group"]
        command += [f"{settings.topic_prefix}{team}", "--concurrency", "3"]
        command += ["--port", str(_free_port())]
        if team == "team-b":
            command.append("--no-spec")  # a team with its handlers and nothing else
        workers[team] = _start(command, env)
    deadline = time.monotonic() + 60
    files = [tmp_path / f"{team}.jsonl" for team in workers]
    while not all(f.exists() and len(f.read_text().splitlines()) >= CALLS for f in files):
        assert time.monotonic() < deadline, "workers did not handle every call"
        assert all(p.poll() is None for p in workers.values()), "a worker exited"
        await asyncio.sleep(0.3)
    for proc in workers.values():
        proc.send_signal(signal.SIGTERM)
    for team, proc in workers.items():
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
        assert proc.returncode == 0, out
        assert "activities worker stopped" in out
        instances = {
            orjson.loads(line)["instance"]
            for line in (tmp_path / f"{team}.jsonl").read_text().splitlines()
        }
        assert instances == {f"c-{i}" for i in range(CALLS)}
        assert await _committed(bootstrap, f"{settings.topic_prefix}{team}", topic) == CALLS
