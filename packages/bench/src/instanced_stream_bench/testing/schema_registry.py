"""A real Confluent-compatible Schema Registry for tests: Apicurio Registry with in-memory
storage, built once with Maven from its published artifacts (see apicurio/pom.xml) into
a cache folder and run with the JDK, as the broker is (testing/broker.py).

It answers the Confluent Schema Registry API under `/apis/ccompat/v7`, which is the URL
`LocalRegistry.url` gives and `STREAM_SCHEMA_REGISTRY_URL` takes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from instanced_stream_bench.testing.jars import BrokerError, require

__all__ = [
    "API",
    "PROJECT",
    "LocalRegistry",
    "ensure_registry_app",
    "registry_url",
    "run_foreground",
]

log = logging.getLogger("stream.registry")

PROJECT = Path(__file__).parent / "apicurio"
API = "/apis/ccompat/v7"  # Apicurio's Confluent-compatible API
HOST = "127.0.0.1"


def _version() -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(PROJECT / "pom.xml").getroot().find("m:properties/m:apicurio.version", ns)
    if node is None or not node.text:
        raise BrokerError(f"{PROJECT / 'pom.xml'} declares no apicurio.version")
    return node.text.strip()


def ensure_registry_app() -> Path:
    """Build the registry once (into $STREAM_KAFKA_CACHE's parent folder or ~/.cache) and
    return its runnable jar. Takes a minute and a few hundred MB of Maven downloads the
    first time; afterwards it is a file check."""
    version = _version()
    base = os.environ.get("STREAM_KAFKA_CACHE")
    root = Path(base).parent if base else Path.home() / ".cache" / "instanced-stream"
    cache = root / f"apicurio-{version}"
    jar, marker = cache / "target" / "quarkus-app" / "quarkus-run.jar", cache / "complete"
    cache.mkdir(parents=True, exist_ok=True)
    # Parallel test workers may arrive at once: one builds, the others wait on the lock.
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = version + "\n" + (PROJECT / "pom.xml").read_text()
        if marker.exists() and marker.read_text() == stamp and jar.exists():
            return jar
        mvn = require("mvn", "Apache Maven (e.g. `apt-get install maven`)")
        # A half-finished build may have left anything behind; start from the sources.
        for leftover in ("target", "src", "pom.xml"):
            path = cache / leftover
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        shutil.copytree(PROJECT / "src", cache / "src")
        shutil.copy(PROJECT / "pom.xml", cache / "pom.xml")
        log.info("building Apicurio Registry %s in %s", version, cache)
        cmd = [mvn, "-q", "-B", "-f", str(cache / "pom.xml"), "package", "-DskipTests"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not jar.exists():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise BrokerError(f"mvn could not build the schema registry:\n{tail}", retriable=True)
        marker.write_text(stamp)
        return jar


def _free_port() -> int:
    from instanced_stream_bench.testing.broker import free_port

    return free_port()


class LocalRegistry:
    """One Apicurio Registry JVM on 127.0.0.1 with in-memory storage: every start is empty."""

    def __init__(self, port: int | None = None, heap_mb: int = 256) -> None:
        self._port = port
        self._heap_mb = heap_mb
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise BrokerError("LocalRegistry has not been started")
        return f"http://{HOST}:{self._port}{API}"

    def start(self, timeout: float = 120) -> str:
        if self._proc is not None and self._proc.poll() is None:
            return self.url
        java = require("java", "a Java 17 runtime (e.g. `apt-get install openjdk-17-jdk`)")
        jar = ensure_registry_app()
        self._port = self._port or _free_port()
        fd, name = tempfile.mkstemp(prefix="stream-registry-", suffix=".log")
        os.close(fd)
        self._log = Path(name)
        cmd = [java, f"-Xmx{self._heap_mb}m", "-XX:+ExitOnOutOfMemoryError"]
        cmd += [f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={self._port}"]
        # Neither its UI nor its own metrics are wanted here; logs at WARN keep the file small.
        cmd += ["-Dquarkus.log.level=WARN", "-jar", str(jar)]
        with self._log.open("ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal must not reach it first
            )
        atexit.register(self.stop)
        try:
            self._wait_ready(time.monotonic() + timeout, timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, deadline: float, budget: float) -> None:
        assert self._proc is not None and self._log is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = "\n".join(self._log.read_text(errors="replace").splitlines()[-40:])
                raise BrokerError(f"the schema registry exited with code {code}:\n{tail}")
            if time.monotonic() > deadline:
                raise BrokerError(f"the schema registry not ready after {budget:g}s")
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 20) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
            self._proc = None
        atexit.unregister(self.stop)
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> LocalRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def registry_url(configured: str | None = None) -> Iterator[str]:
    """Yield a registry URL: `configured` (STREAM_SCHEMA_REGISTRY_URL), else a local
    Apicurio Registry started here."""
    if configured:
        yield configured
        return
    with LocalRegistry() as registry:
        yield registry.url


def run_foreground(port: int | None) -> int:
    """Run a registry until SIGINT or SIGTERM; the body of `stream registry`, as
    `stream broker` runs a broker (testing/broker.py)."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    registry = LocalRegistry(port=port)
    try:
        url = registry.start()
        print(
            f"Schema registry (Apicurio {_version()}, Confluent API, schemas in memory) ready "
            f"at {url}. Ctrl-C to stop.\nexport STREAM_SCHEMA_REGISTRY_URL={url}",
            flush=True,
        )
        while not stop.wait(1):
            if not registry.running:
                print("the schema registry exited unexpectedly", flush=True)
                return 1
    finally:
        registry.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
