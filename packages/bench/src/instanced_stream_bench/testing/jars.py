"""The Apache Kafka broker's jars, resolved once with Maven from the published artifacts
(`org.apache.kafka:kafka_2.13`, see kafka/pom.xml) into a cache folder."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from instanced_stream.errors import StreamError

__all__ = ["POM", "BrokerError", "ensure_jars", "kafka_version", "require"]

log = logging.getLogger("stream.broker")

POM = Path(__file__).parent / "kafka" / "pom.xml"


class BrokerError(StreamError):
    """The broker could not be provided; `retriable` says whether trying again may help."""

    def __init__(self, message: str, *, retriable: bool = False, **data: Any) -> None:
        super().__init__(message, **data)
        self.retriable = retriable


def kafka_version() -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(POM).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not node.text:
        raise BrokerError(f"{POM} declares no kafka.version")
    return node.text.strip()


def require(tool: str, hint: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise BrokerError(f"`{tool}` not found on PATH; install {hint}")
    return found


def ensure_jars() -> Path:
    """Download the broker's jars once (into $STREAM_KAFKA_CACHE or ~/.cache) and return
    the folder holding them."""
    version = kafka_version()
    default = Path.home() / ".cache" / "instanced-stream" / f"kafka-{version}"
    cache = Path(os.environ.get("STREAM_KAFKA_CACHE") or default)
    jars, marker = cache / "jars", cache / "complete"
    cache.mkdir(parents=True, exist_ok=True)
    # Parallel test workers and a demo may all arrive here at once; one downloads, the
    # others block on the lock and then find the marker.
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text().strip() == version:
            return jars
        mvn = require("mvn", "Apache Maven (e.g. `apt-get install maven`)")
        # Jars left by an interrupted run may be truncated; start from nothing.
        shutil.rmtree(jars, ignore_errors=True)
        log.info("downloading Kafka %s jars into %s", version, jars)
        cmd = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies"]
        cmd += [f"-DoutputDirectory={jars}", "-DincludeScope=runtime"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise BrokerError(f"mvn could not fetch the Kafka jars:\n{tail}", retriable=True)
        marker.write_text(version + "\n")
        return jars
