"""The processes of a churn run: its work folder and the LLM simulator (`prepare_run`),
processors of one group started and stopped by slot (each start a new life, with its own
log and peak RSS), the tickets example's activity worker, and the topics and settings
they run on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.topics import activity_topics, ensure_product_topics, ensure_topics
from instanced_stream.settings import EXAMPLES, Settings

from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.harness.load import rss_mb
from instanced_stream_bench.harness.report import Endpoint
from instanced_stream_bench.harness.target import SimProcess
from instanced_stream_bench.testing.broker import free_port
from instanced_stream_bench.testing.sim.server import MODEL_NAME

__all__ = [
    "ACTIVITIES",
    "SPEC",
    "Deploy",
    "Group",
    "Life",
    "Worker",
    "deploy",
    "keep_logs_of",
    "prepare_run",
]

SPEC = EXAMPLES / "tickets" / "agent.yaml"


ACTIVITIES = EXAMPLES / "tickets" / "activities.py"


_STOP_GRACE_S = 40.0  # SIGTERM, then SIGKILL: the processor drains up to drain_s (25 s)


@contextlib.asynccontextmanager
async def prepare_run(
    latency_ms: float | None, keep_logs: Path | None = None
) -> AsyncIterator[tuple[Path, SimProcess]]:
    """A run's work folder and the LLM simulator as its own process in it, ready and,
    with `latency_ms`, answering after that long (32 requests at once, a roomy token
    budget: the endpoint is not what a churn run measures; None keeps the simulator's
    own settings). On the way out the simulator stops and, with `keep_logs`, the
    processors' logs are copied there before the folder goes."""
    with tempfile.TemporaryDirectory(prefix="stream-churn-") as tmp:
        workdir = Path(tmp)
        sim = SimProcess(workdir)
        sim.start()
        try:
            await sim.ready()
            if latency_ms is not None:
                await sim.configure(Endpoint(latency_ms, 1.0, 32, 20_000_000).config())
            yield workdir, sim
        finally:
            sim.stop()
            if keep_logs is not None:
                keep_logs_of(workdir, keep_logs)


def keep_logs_of(workdir: Path, folder: Path) -> None:
    """The processors' logs of a run's work folder, copied to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("run-*/*.log"):
        (folder / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())


class Worker:
    """The example's activity worker, `stream activities`, as its own process."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        # a free probe port unless one is named (the default 6067 may be taken on this host)
        self.env = {"STREAM_WORKER_WEB_PORT": "0", **os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "instanced_stream", "activities", str(ACTIVITIES)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@dataclass(slots=True)
class Life:
    """One processor process from start to exit: its own log, its peak RSS."""

    name: str
    proc: ProcessorProcess
    started_s: float
    stopped_s: float | None = None
    peak_rss_mb: float = 0.0
    exit_code: int | None = None
    killed: bool = False  # needed SIGKILL after its grace


class Group:
    """Processors of one group, started and stopped by slot; each start is a new life.
    With `static` (a name prefix), each slot is a static member (KIP-345) named
    `{static}-{slot}` in every life, as a StatefulSet names its pods: a restarted member
    takes its partitions back without a rebalance of the group."""

    def __init__(
        self, env: dict[str, str], run_dir: Path, origin: float, static: str | None = None
    ) -> None:
        self.env = env
        self.run_dir = run_dir
        self.origin = origin
        self.static = static
        self.lives: list[Life] = []
        self.running: dict[int, Life] = {}

    def start(self, slot: int, env: dict[str, str] | None = None) -> Life:
        """A new life in `slot`; `env` adds to the group's environment for it alone."""
        n = sum(1 for life in self.lives if life.name.startswith(f"p{slot}."))
        env = {**self.env, **(env or {}), "STREAM_WEB_PORT": str(free_port())}
        if self.static is not None:
            env["STREAM_GROUP_INSTANCE_ID"] = f"{self.static}-{slot}"
        proc = ProcessorProcess(env, self.run_dir / f"processor{slot}.{n}.log")
        proc.start()
        life = Life(f"p{slot}.{n}", proc, time.monotonic() - self.origin)
        self.lives.append(life)
        self.running[slot] = life
        return life

    async def stop(self, slots: Iterable[int]) -> None:
        lives = [self.running.pop(s) for s in slots if s in self.running]
        await asyncio.gather(*(asyncio.to_thread(self._stop, life) for life in lives))

    def _stop(self, life: Life) -> None:
        proc = life.proc.proc
        if proc is None:
            return
        life.stopped_s = time.monotonic() - self.origin
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                life.killed = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        life.exit_code = proc.returncode

    def sample(self) -> None:
        for life in self.running.values():
            if life.proc.proc is not None:
                rss = rss_mb(life.proc.proc.pid)
                if rss is not None:
                    life.peak_rss_mb = max(life.peak_rss_mb, rss)

    def exited(self) -> list[Life]:
        """Lives that ended on their own (a crash), noted and let go."""
        out = []
        for slot, life in list(self.running.items()):
            if life.proc.proc is not None and life.proc.proc.poll() is not None:
                life.exit_code = life.proc.proc.returncode
                life.stopped_s = time.monotonic() - self.origin
                del self.running[slot]
                out.append(life)
        return out


@dataclass(slots=True)
class Deploy:
    settings: Settings
    env: dict[str, str]
    outcome_topics: list[str]
    tools: list[str]
    run_dir: Path

    def start_worker(self) -> Worker:
        """The example's activity worker on this deployment, started, logging in its
        run folder."""
        worker = Worker(self.env, self.run_dir / "activities.log")
        worker.start()
        return worker


async def deploy(
    bootstrap: str,
    sim: SimProcess,
    workdir: Path,
    partitions: int,
    window_wait_ms: int | None = None,
    replication: int | None = None,
    min_insync: int | None = None,
) -> Deploy:
    """Fresh topics and the environment of the tickets example's processors; with
    `window_wait_ms`, its windows wait that long for their items; `replication` and
    `min_insync` (a cluster's run) for every topic created, theirs too."""
    prefix = f"churn-{secrets.token_hex(3)}."
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    data = yaml.safe_load(SPEC.read_text())
    if window_wait_ms is not None:
        data["window"] = {**data.get("window", {}), "max_wait_ms": window_wait_ms}
    spec_path = run_dir / "agent.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=partitions,
        spec=spec_path,
        replication_factor=replication,
        min_insync_replicas=min_insync,
    )
    spec = load_spec(spec_path)
    await ensure_product_topics(bootstrap, settings, spec)
    tools = activity_topics(settings, spec)
    # The review topic is read by the audit whether or not the spec reviews calls.
    durable = {"min.insync.replicas": str(min_insync)} if min_insync else None
    await ensure_topics(
        bootstrap, [settings.topics.review], partitions, replication or 1, config=durable
    )
    env = {
        "STREAM_BOOTSTRAP_SERVERS": bootstrap,
        "STREAM_TOPIC_PREFIX": prefix,
        "STREAM_PARTITIONS": str(partitions),
        "STREAM_LLM_BASE_URL": f"{sim.url}/v1",
        "STREAM_LLM_MODEL": MODEL_NAME,
        "STREAM_SPEC": str(spec_path),
        "STREAM_DATA_DIR": str(run_dir / "data"),
        "STREAM_LOG_LEVEL": "INFO",
        "STREAM_LOG_FORMAT": "json",
        "STREAM_DELIVERY": "exactly_once",
    }
    if replication is not None:
        env["STREAM_REPLICATION_FACTOR"] = str(replication)
    if min_insync is not None:
        env["STREAM_MIN_INSYNC_REPLICAS"] = str(min_insync)
    outcome = [*tools, settings.topics.review, settings.topics.no_action]
    outcome.append(settings.topics.dead_letter)
    return Deploy(settings, env, outcome, tools, run_dir)
