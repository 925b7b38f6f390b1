"""A new user's path from the README: publish a JSONL file, then read the decisions."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Deploy = Callable[..., Awaitable[Deployment]]


async def test_publish_a_jsonl_file_and_read_the_decisions(deploy: Deploy, tmp_path: Path) -> None:
    dep = await deploy()
    data = tmp_path / "mine.jsonl"
    lines = [
        orjson.dumps({"id": f"u-{i}", "comment": f"my comment {i}"}).decode() for i in range(12)
    ]
    data.write_text("\n".join([*lines, "not json at all"]) + "\n")
    sent = await dep.cli("produce", str(data), "--key-field", "id")
    assert sent.returncode == 1  # one line was not JSON: said, and not sent
    assert "12" in sent.stderr + sent.stdout and "line 13" in sent.stderr + sent.stdout
    report = await dep.settle(12)
    assert report.unaccounted == 0
    shown = await dep.cli("tail", "activity.moderateComment", "--last", "50", "--json")
    assert shown.returncode == 0
    rows = [orjson.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    assert sorted(r["key"] for r in rows) == sorted(f"u-{i}" for i in range(12))
    assert all(r["value"]["call"]["decision"] in ("approve", "reject") for r in rows)
    listed = await dep.cli("topics")
    assert listed.returncode == 0 and "items" in listed.stdout
    audited = await dep.cli("audit")
    assert audited.returncode == 0 and "missing=0" in audited.stdout


async def _stream(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "instanced_stream", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


async def test_stream_audit_on_a_finished_demo_prints_missing_0(bootstrap: str) -> None:
    env = {**os.environ, "STREAM_BOOTSTRAP_SERVERS": bootstrap}
    demo = await _stream(env, "demo", "--items", "60", "--json")
    assert demo.returncode == 0, demo.stderr[-2000:]
    result = orjson.loads(demo.stdout.strip().splitlines()[-1])
    assert result["unaccounted"] == 0 and "missing=0" in result["audit"]
    audited = await _stream(env, "--topic-prefix", result["topics_prefix"], "audit")
    assert audited.returncode == 0, audited.stderr[-2000:]
    assert "inputs=60 " in audited.stdout and "missing=0" in audited.stdout
