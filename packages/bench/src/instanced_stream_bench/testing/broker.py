"""A real Apache Kafka broker for tests, demos and `stream broker`.

Order of choice in `kafka_bootstrap`: a configured address, then a Docker container, then a
single-node KRaft broker run straight from Maven jars, so the project works on machines that
have a JDK but no Docker.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import ctypes
import importlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from instanced_stream_bench.testing.jars import BrokerError, ensure_jars, kafka_version, require
from instanced_stream_bench.testing.listeners import oauth_listener

__all__ = [
    "BrokerError",
    "LocalKafka",
    "Tls",
    "die_with_parent",
    "docker_available",
    "ensure_jars",
    "free_port",
    "free_ports",
    "kafka_bootstrap",
    "new_cluster_id",
    "remove_tree",
    "run_foreground",
]

log = logging.getLogger("stream.broker")

HOST = "127.0.0.1"
_T = TypeVar("_T")


def free_port() -> int:
    """A port nobody listens on now, on the loopback address."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different ports nobody listens on now, on the loopback address."""
    # All sockets stay open until every port is picked, so the ports differ.
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]


def _check_free(port: int) -> None:
    # Kafka only binds its client port late in start-up and then dies with a long stack
    # trace; finding the clash first gives a short message and saves seconds.
    with socket.socket() as s:
        # SO_REUSEADDR as Kafka itself uses, so TIME_WAIT leftovers of a killed broker pass.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise BrokerError(f"port {port} on {HOST} is in use", retriable=True) from e


def new_cluster_id() -> str:
    """A KRaft cluster id, as StorageTool's `random-uuid` prints one."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # A leading dash would be read as an option by StorageTool's argument parser.
        if not cid.startswith("-"):
            return cid


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion even when the calling thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def die_with_parent() -> None:
    """In a child, before it runs: the kernel sends it SIGTERM when the process that
    started it dies, however it died (a SIGKILL runs no clean-up), so no broker or
    processor is left running under init. Linux only; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.kafka.coordinator.group=INFO
"""


@dataclass(frozen=True, slots=True)
class Tls:
    """A TLS listener's files: the broker's key and certificate chain in one PEM file
    (PKCS#8 key, unencrypted), the CA that signs clients, and whether clients must
    show a certificate (mutual TLS). With `sasl_users`, a second listener takes
    SASL_SSL with the PLAIN mechanism for these user names and passwords."""

    keystore_pem: Path
    ca_pem: Path
    client_auth: bool = False
    sasl_users: dict[str, str] | None = None


class LocalKafka:
    """One KRaft broker+controller JVM on 127.0.0.1, started from the cached Maven jars."""

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int | None = None,
        heap_mb: int = 512,
        tls: Tls | None = None,
        oauth: bool = False,
        controller_port: int | None = None,
        cluster_id: str | None = None,
        overrides: dict[str, str] | None = None,
    ):
        """`controller_port`, `cluster_id` and `overrides` (server properties set over
        the single node's) let one node of a cluster (testing/cluster.py) be started
        with its peers' voters and replication."""
        self._given_dir = data_dir
        self._dir: Path | None = data_dir
        self._port = port
        self._cport: int | None = controller_port
        self._cluster = cluster_id
        self._overrides = dict(overrides or {})
        self._tls = tls
        self._tls_ports: tuple[int, int] | None = None  # SSL, SASL_SSL
        self._oauth_port: int | None = 0 if oauth else None  # SASL_PLAINTEXT OAUTHBEARER
        self._heap_mb = heap_mb
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def ssl_bootstrap(self) -> str:
        """The TLS listener's address (the plaintext one stays for the broker's own use)."""
        if self._tls_ports is None:
            raise BrokerError("LocalKafka has no TLS listener, or has not been started")
        return f"{HOST}:{self._tls_ports[0]}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        if self._tls_ports is None or not (self._tls and self._tls.sasl_users):
            raise BrokerError("LocalKafka has no SASL_SSL listener, or has not been started")
        return f"{HOST}:{self._tls_ports[1]}"

    @property
    def oauth_bootstrap(self) -> str:
        """The SASL_PLAINTEXT listener taking OAUTHBEARER with unsecured tokens."""
        if not self._oauth_port:
            raise BrokerError("LocalKafka has no OAUTHBEARER listener, or has not been started")
        return f"{HOST}:{self._oauth_port}"

    @property
    def bootstrap(self) -> str:
        if self._port is None:
            raise BrokerError("LocalKafka has not been started")
        return f"{HOST}:{self._port}"

    @property
    def data_dir(self) -> Path | None:
        return self._dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 120) -> str:
        if self.running:
            return self.bootstrap
        java = require("java", "a Java 11+ runtime (e.g. `apt-get install openjdk-17-jdk`)")
        jars = ensure_jars()
        # Ports are fixed on first start so a restart looks like the same broker to clients.
        if self._port is None:
            self._port = free_ports(1)[0]
        if self._cport is None:
            self._cport = next(p for p in free_ports(2) if p != self._port)
        if self._tls is not None and self._tls_ports is None:
            spare = [p for p in free_ports(4) if p not in (self._port, self._cport)]
            self._tls_ports = (spare[0], spare[1])
        if self._oauth_port == 0:
            used = (self._port, self._cport, *(self._tls_ports or ()))
            self._oauth_port = next(p for p in free_ports(5) if p not in used)
        for p in (self._port, self._cport):
            _check_free(p)
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="stream-kafka-"))
        atexit.unregister(self._reap_at_exit)
        atexit.register(self._reap_at_exit)
        try:
            self._launch(java, jars, self._dir)
            _run_sync(self._wait_ready(time.monotonic() + timeout, timeout))
        except BaseException:
            self.kill()
            self.stop()
            raise
        return self.bootstrap

    def _launch(self, java: str, jars: Path, data: Path) -> None:
        data.mkdir(parents=True, exist_ok=True)
        config = data / "server.properties"
        config.write_text(self._properties(data))
        (data / "log4j.properties").write_text(LOG4J)
        classpath = [f"-Dlog4j.configuration=file:{data / 'log4j.properties'}", "-cp", f"{jars}/*"]
        if not (data / "logs" / "meta.properties").exists():
            cluster = self._cluster or new_cluster_id()
            cmd = [java, *classpath, "kafka.tools.StorageTool", "format", "-t", cluster]
            cmd += ["-c", str(config), "--ignore-formatted"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise BrokerError(f"formatting {data} failed:\n{done.stdout}{done.stderr}")
        heap = f"{self._heap_mb}m"
        jvm = [java, f"-Xmx{heap}", f"-Xms{heap}", "-XX:+ExitOnOutOfMemoryError", *classpath]
        with (data / "kafka.out").open("ab") as out:
            self._proc = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group: Ctrl-C in a terminal must not reach the broker
                # before we stop it in order.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def _properties(self, data: Path) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self._cport}",
            "listeners": f"PLAINTEXT://{HOST}:{self._port},CONTROLLER://{HOST}:{self._cport}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self._port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data / "logs"),
            "offsets.topic.replication.factor": "1",
            # Fewer offset partitions: the group coordinator loads faster on a 2-core box.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "num.partitions": "1",
            "log.retention.hours": "24",
            # After a SIGKILL the controller keeps the dead broker's registration until its
            # session expires, and the restarted broker cannot register before then; the
            # default 9 s (plus retry back-off) made every crash-restart take ~15 s.
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
        }
        props.update(self._overrides)
        if self._tls is not None and self._tls_ports is not None:
            props.update(self._tls_properties(props))
        if self._oauth_port:
            props.update(oauth_listener(props, HOST, self._oauth_port))
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _tls_properties(self, props: dict[str, str]) -> dict[str, str]:
        assert self._tls is not None and self._tls_ports is not None
        tls, (ssl_port, sasl_port) = self._tls, self._tls_ports
        names = [("SSL", ssl_port)] + ([("SASL_SSL", sasl_port)] if tls.sasl_users else [])
        extra = {
            "listeners": props["listeners"] + "".join(f",{n}://{HOST}:{p}" for n, p in names),
            "advertised.listeners": props["advertised.listeners"]
            + "".join(f",{n}://{HOST}:{p}" for n, p in names),
            "listener.security.protocol.map": props["listener.security.protocol.map"]
            + "".join(f",{n}:{n}" for n, _ in names),
            # PEM stores (Kafka 2.7+): no JKS conversion, the files a CA tool writes.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls.keystore_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca_pem),
            "listener.name.ssl.ssl.client.auth": "required" if tls.client_auth else "none",
        }
        if tls.sasl_users:
            users = " ".join(f'user_{u}="{pw}"' for u, pw in tls.sasl_users.items())
            extra["sasl.enabled.mechanisms"] = "PLAIN"
            extra["listener.name.sasl_ssl.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            )
            extra["listener.name.sasl_ssl.ssl.client.auth"] = "none"
        return extra

    async def _wait_ready(self, deadline: float, budget: float) -> None:
        from instanced_stream.kafka import clients

        assert self._proc is not None
        assert self._dir is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                lines = (self._dir / "kafka.out").read_text(errors="replace").splitlines()
                out = "\n".join(lines[-40:])
                raise BrokerError(f"Kafka exited with code {code} during start-up:\n{out}")
            if time.monotonic() > deadline:
                raise BrokerError(f"Kafka not ready after {budget:g}s", retriable=True)
            # Kafka opens its client port only once it serves requests; a plain connect
            # first keeps aiokafka from logging a connection error on every early poll.
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, self._port), timeout=1
                )
                writer.close()
            except (OSError, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            admin = clients.admin(self.bootstrap, request_timeout_ms=5000)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except Exception as e:
                log.debug("broker not ready yet: %r", e)
                await asyncio.sleep(0.5)
            finally:
                await admin.close()

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def stop(self, timeout: float = 30) -> None:
        """Shut down cleanly (SIGKILL after `timeout`); a temporary data dir is removed."""
        if self._proc is not None:
            self._signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("Kafka did not stop within %.0fs; killing it", timeout)
                self.kill()
            self._proc = None
        atexit.unregister(self._reap_at_exit)
        if self._given_dir is None and self._dir is not None:
            remove_tree(self._dir)
            self._dir = None

    def discard(self) -> None:
        """Ends a throwaway broker at once: its data goes with it, so a clean shutdown (tens
        of seconds with a test session's hundreds of topics) would buy nothing."""
        self.kill()
        self._proc = None
        self.stop()

    def kill(self) -> None:
        """Crash the broker (SIGKILL) but keep its data, as a fault test needs."""
        if self._proc is not None:
            self._signal(signal.SIGKILL)
            self._proc.wait()

    def _reap_at_exit(self) -> None:
        # The broker lives in its own session, so nothing else ends it if Python exits first.
        self.stop(timeout=10)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def docker_available() -> bool:
    """True only when a Docker daemon answers within a few seconds."""
    try:
        # Imported by name: the docker package ships no type information.
        docker: Any = importlib.import_module("docker")
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def remove_tree(root: Path, workers: int = 16) -> None:
    """Removes a broker's data folder, its partition folders in parallel. One after the
    other, the unlinks of a demo broker's few hundred partition files took 2.5-4 s on a
    busy disk (most of the demo's exit after Ctrl-C); in parallel the file system
    commits them together, several times faster."""
    parts = [e.path for top in (root, root / "logs") if top.is_dir() for e in os.scandir(top)]
    dirs = [p for p in parts if os.path.isdir(p) and not p.endswith(os.sep + "logs")]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda d: shutil.rmtree(d, ignore_errors=True), dirs))
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def kafka_bootstrap(configured: str | None = None) -> Iterator[str]:
    """Yield a bootstrap address: `configured` (the settings' bootstrap_servers), else a
    broker started here (Docker, or the local jars)."""
    if configured:
        log.info("using Kafka at %s", configured)
        yield configured
        return
    if docker_available():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers before the community split
            from testcontainers.kafka import KafkaContainer
        container = KafkaContainer()
        if hasattr(container, "with_kraft"):
            container = container.with_kraft()
        log.info("starting Kafka in Docker (%s)", container.image)
        with container:
            yield str(container.get_bootstrap_server())
        return
    log.info("Docker not available; starting a local Kafka %s from jars", kafka_version())
    broker = LocalKafka()
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.discard()


def run_foreground(port: int | None, data_dir: Path | None) -> int:
    """Run a broker until SIGINT or SIGTERM; the body of `stream broker`."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    broker = LocalKafka(data_dir=data_dir, port=port)
    try:
        address = broker.start()
        where = f"{address} (data: {broker.data_dir})"
        print(f"Kafka {kafka_version()} ready at {where}. Ctrl-C to stop.", flush=True)
        while not stop.wait(1):
            if not broker.running:
                print(f"Kafka exited unexpectedly; see {broker.data_dir}/kafka.out", flush=True)
                return 1
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
