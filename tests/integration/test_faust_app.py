"""docs/faust.md's app, run verbatim with the page's own run command, beside a processor on
default settings: it starts, handles every decision the processor publishes, and commits
what it handled. Both processes get the same STREAM_* environment, as on one host; the
web ports are free ones rather than the defaults (6066, 6068), which other processes on a
shared machine may hold: that the defaults differ is tests/unit/activities/test_faust_app.py's."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from instanced_stream.settings import Settings
from instanced_stream_bench.testing.broker import free_port
from instanced_stream_bench.testing.samples import comments

from tests.conftest import Deployment
from tests.integration.test_faust_worker import Deploy, _commit_lag

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "faust.md"
DECIDED = re.compile(r"decided (\S+): (approve|reject)")


def _page() -> tuple[str, list[str]]:
    """The page's module (its first python block) and its run command (the bash line that
    runs `faust -A`): what a reader copies."""
    text = DOC.read_text()
    module = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    runs = [ln for ln in re.findall(r"```bash\n(.*?)```", text, re.S) if "faust -A" in ln]
    assert runs, "docs/faust.md gives no `faust -A ... worker` command"
    return module, shlex.split(runs[0].strip())


def _start(dep: Deployment, tmp: Path, log_path: Path, faust_port: int) -> subprocess.Popen[bytes]:
    module, command = _page()
    env_words = [w for w in command if re.fullmatch(r"[A-Z_]+=.*", w)]
    argv = command[len(env_words) :]
    assert argv[:3] == ["faust", "-A", "my_activities"], argv
    (tmp / "my_activities.py").write_text(module)
    env = {
        # the page's STREAM_BOOTSTRAP_SERVERS=... names its reader's broker; here, the test's
        **dict(w.split("=", 1) for w in env_words),
        "STREAM_BOOTSTRAP_SERVERS": dep.bootstrap,
        "STREAM_TOPIC_PREFIX": dep.settings.topic_prefix,
        "STREAM_WEB_HOST": dep.proc.env["STREAM_WEB_HOST"],
        "STREAM_WEB_PORT": dep.proc.env["STREAM_WEB_PORT"],
        "STREAM_FAUST_WEB_PORT": str(faust_port),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
    }
    faust = str(Path(sys.executable).with_name("faust"))
    return subprocess.Popen(
        [faust, *argv[1:]], cwd=tmp, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT
    )


async def test_the_pages_faust_app_runs_beside_a_default_processor(
    deploy: Deploy, tmp_path: Path
) -> None:
    defaults = Settings(_env_file=None)
    dep = await deploy(STREAM_WEB_HOST=defaults.web_host, STREAM_DELIVERY=defaults.delivery)
    log_path = tmp_path / "faust.log"
    faust_port = free_port()
    app = _start(dep, tmp_path, log_path, faust_port)
    items = comments(8)
    try:
        await dep.produce_items(items)
        report = await dep.settle(len(items))
        assert report.unaccounted == 0, report.summary()
        calls = await dep.records(dep.activity_topic("moderateComment"))
        wanted = {(c["instance"], c["call"]["decision"]) for c in calls}
        assert {i for i, _ in wanted} == {str(i["_instance"]) for i in items}
        deadline = time.monotonic() + 60
        while set(DECIDED.findall(log_path.read_text())) != wanted:
            assert app.poll() is None, "the faust app died:\n" + log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "calls never handled:\n" + log_path.read_text()
            await asyncio.sleep(0.5)
        # and it commits them: faust's group reaches the end of the activity topic (or
        # the one before it: the last transaction's marker, docs/faust.md)
        group = dep.settings.topic_prefix + "my-team-activities"
        lag: dict[str, int] = {}
        while time.monotonic() < deadline:
            lag = await _commit_lag(dep.bootstrap, group)
            if lag and set(lag.values()) <= {0, 1}:
                break
            await asyncio.sleep(0.5)
        assert lag and set(lag.values()) <= {0, 1}, lag
        assert app.poll() is None, log_path.read_text()[-3000:]
        assert "address already in use" not in log_path.read_text()
        # faust's web server is up on its own port, beside the processor's
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{faust_port}/") as page:
                assert page.status < 500, page.status
            async with http.get(f"{dep.web}/healthz") as health:
                assert health.status == 200
    finally:
        app.terminate()
        try:
            app.wait(30)
        except subprocess.TimeoutExpired:
            app.kill()  # faust 0.15.3 sometimes hangs on stop (docs/faust.md)
            app.wait(10)
        print(log_path.read_text()[-3000:])
