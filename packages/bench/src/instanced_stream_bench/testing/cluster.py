"""Three (or more) KRaft brokers on one host, one Kafka cluster: what a durability or
failover test needs and one broker cannot give (a group or transaction coordinator that
moves when its broker dies).

Each node is a `LocalKafka` (broker and controller in one JVM) with its own ports and log
directory, the same cluster id, `node.id` 1..n and `controller.quorum.voters` naming every
node; internal topics are replicated to every node, and topics created without a
replication factor get all of them with `min.insync.replicas` one less (2 of 3). The
nodes start together: none serves before a quorum of controllers has formed, so starting
them one after another would wait on the first for ever.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from instanced_stream_bench.testing.broker import (
    HOST,
    BrokerError,
    LocalKafka,
    free_ports,
    new_cluster_id,
)

__all__ = ["LocalCluster"]


class LocalCluster:
    """`size` KRaft nodes on 127.0.0.1; `kill(n)` and `start_node(n)` crash and restart
    node n (1-based, its `node.id`) keeping its data and ports."""

    def __init__(self, size: int = 3, root: Path | None = None, heap_mb: int = 384) -> None:
        if size < 1:
            raise BrokerError(f"a cluster needs at least one node, not {size}")
        self.size = size
        self._given = root
        self._root = root
        self._heap_mb = heap_mb
        self.nodes: dict[int, LocalKafka] = {}
        self._owners: dict[int, ThreadPoolExecutor] = {}

    @property
    def bootstrap(self) -> str:
        """Every node's address: a client reaches the cluster while any one is down."""
        if not self.nodes:
            raise BrokerError("LocalCluster has not been started")
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def replication(self) -> int:
        return self.size

    @property
    def min_insync(self) -> int:
        return max(1, self.size - 1)

    def _properties(self, node_id: int, voters: str) -> dict[str, str]:
        rf = str(self.replication)
        isr = str(self.min_insync)
        return {
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
        }

    def start(self, timeout: float = 180) -> str:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="stream-cluster-"))
        ports = free_ports(2 * self.size)
        client = dict(zip(range(1, self.size + 1), ports[: self.size], strict=True))
        control = dict(zip(range(1, self.size + 1), ports[self.size :], strict=True))
        voters = ",".join(f"{n}@{HOST}:{control[n]}" for n in control)
        cluster = new_cluster_id()
        for n in client:
            self.nodes[n] = LocalKafka(
                data_dir=self._root / f"node{n}",
                port=client[n],
                heap_mb=self._heap_mb,
                controller_port=control[n],
                cluster_id=cluster,
                overrides=self._properties(n, voters),
            )
        # Each node is launched, and relaunched, from a thread of its own that lives as
        # long as the cluster: the broker's parent-death signal (testing/broker.py) fires
        # when the thread that started it ends, not only the process.
        self._owners = {n: ThreadPoolExecutor(1, f"kafka-node{n}") for n in self.nodes}
        started = [self._owners[n].submit(node.start, timeout) for n, node in self.nodes.items()]
        errors = [exc for f in started if (exc := f.exception()) is not None]
        if errors:
            self.stop()
            raise BrokerError(f"the cluster did not start: {errors[0]}") from errors[0]
        return self.bootstrap

    def kill(self, node_id: int) -> None:
        """SIGKILL node `node_id`; its data and ports are kept for `start_node`."""
        self.nodes[node_id].kill()

    def start_node(self, node_id: int, timeout: float = 120) -> None:
        """Starts a killed node again and waits until it serves."""
        self._owners[node_id].submit(self.nodes[node_id].start, timeout).result()

    def running(self, node_id: int) -> bool:
        return self.nodes[node_id].running

    def stop(self) -> None:
        # Together: a node left alone without its quorum waits out its controlled
        # shutdown, so one after another would cost each node's whole grace.
        threads = [threading.Thread(target=_stop, args=(node,)) for node in self.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for owner in self._owners.values():
            owner.shutdown(wait=False)
        self._owners = {}
        if self._given is None and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop(node: LocalKafka) -> None:
    with contextlib.suppress(Exception):
        node.stop(timeout=20)
