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


_HANDLERS = """
import asyncio, json, os
from instanced_stream.activities import Activities

activities = Activities()
SLOW = os.environ.get("SLOW_HANDLER") == "1"


@activities.activity("moderateComment")
async def moderate(call, tool, context):
    if SLOW and call.instance.startswith("slow"):
        await asyncio.sleep(10)  # past the worker's fetch timeout: its group drops it
    with open(os.environ["HANDLED_FILE"], "a") as out:
        out.write(json.dumps({"instance": call.instance, "pid": os.getpid()}) + "\\n")
"""


def _call(instance: str) -> bytes:
    return orjson.dumps(
        {
            "call_id": f"items/0/{instance}/moderateComment/0",
            "tool": "moderateComment",
            "instance": instance,
            "call": {"_tool": "moderateComment", "_instance": instance, "decision": "approve"},
            "source": {"topic": "items", "partition": 0, "offset": 0},
            "batch": {"id": "b", "size": 1, "token": "①", "attempt": 1},
            "model": "m",
        }
    )


def _start_logged(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def _handled(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_worker_whose_commit_is_refused_rejoins_and_goes_on(
    bootstrap: str, tmp_path: Path
) -> None:
    """A handler slower than the fetch timeout makes the group drop its worker; the
    worker's commit is then refused (CommitFailedError, which ended the process): it
    rejoins and goes on handling calls, while the other member handled the dropped ones."""
    settings = Settings(bootstrap_servers=bootstrap, topic_prefix=f"r{secrets.token_hex(3)}.")
    await ensure_product_topics(bootstrap, settings, load_spec(settings.spec))
    topic = settings.topics.activity("moderateComment")
    handlers = tmp_path / "handlers.py"
    handlers.write_text(_HANDLERS)
    group = f"{settings.topic_prefix}riders"
    logs, workers = {}, {}
    for name, slow in (("a", "1"), ("b", "0")):
        env = {
            **os.environ,
            "STREAM_BOOTSTRAP_SERVERS": bootstrap,
            "STREAM_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_WEB_HOST": "127.0.0.1",
            "STREAM_WORKER_FETCH_TIMEOUT_S": "3",
            "SLOW_HANDLER": slow,
            "HANDLED_FILE": str(tmp_path / f"{name}.jsonl"),
        }
        command = [sys.executable, "-m", "instanced_stream", "activities", str(handlers)]
        command += ["--group", group, "--port", str(_free_port())]
        logs[name] = tmp_path / f"{name}.log"
        workers[name] = _start_logged(command, env, logs[name])
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()

    async def one_per_partition(stem: str) -> None:
        for p in range(settings.partitions):
            await producer.send_and_wait(topic, _call(f"{stem}-{p}"), partition=p)

    async def until(what: str, done: object, seconds: float, feed: str | None = None) -> None:
        deadline, round_ = time.monotonic() + seconds, 0
        while not callable(done) or not done():
            assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
            for name, proc in workers.items():
                assert proc.poll() is None, f"worker {name} exited: {logs[name].read_text()}"
            if feed is not None:
                await one_per_partition(f"{feed}{round_}")
                round_ += 1
            await asyncio.sleep(1.0)

    try:
        # both members hold partitions: each has handled a call
        await until(
            "both workers to own partitions", lambda: _handled(a) and _handled(b), 60, "warm"
        )
        await one_per_partition("slow")
        refused = "the group moved on before the commit"
        await until("worker a's refused commit", lambda: refused in logs["a"].read_text(), 40)
        pid_a = workers["a"].pid

        def a_goes_on() -> bool:
            return any(str(r["instance"]).startswith("after") for r in _handled(a))

        await until("worker a to handle calls again", a_goes_on, 40, "after")
        assert workers["a"].pid == pid_a and workers["a"].poll() is None
        slow_done = {r["instance"] for r in _handled(a) + _handled(b)}
        assert {f"slow-{p}" for p in range(settings.partitions)} <= slow_done
    finally:
        await producer.stop()
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            await asyncio.to_thread(proc.wait, 30)
    assert workers["a"].returncode == 0, logs["a"].read_text()[-3000:]
    assert "Traceback" not in logs["a"].read_text()
