"""The broker that coordinates a consumer group, killed and restarted during a run on a
local cluster (testing/cluster.py): found with the admin client's public
`find_coordinator`, SIGKILLed, watched until another broker coordinates the group (the
failover), started again after a while. Each kill is kept with its times (seconds since
the run's origin) for the report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from instanced_stream.kafka import clients

from instanced_stream_bench.harness.progress import unowned
from instanced_stream_bench.testing.cluster import LocalCluster

__all__ = ["BrokerKiller"]


class BrokerKiller:
    """`kill_coordinator` kills the group's coordinator, waits for its failover and keeps
    it down `down_s` from the kill before starting it again."""

    def __init__(self, cluster: LocalCluster, down_s: float = 10.0) -> None:
        self.cluster = cluster
        self.down_s = down_s
        self.group = ""
        self.origin = time.monotonic()
        self.say: Callable[[str], None] = print
        self.kills: list[dict[str, Any]] = []

    def begin(self, group: str, origin: float, say: Callable[[str], None]) -> None:
        self.group, self.origin, self.say = group, origin, say

    def _now(self) -> float:
        return time.monotonic() - self.origin

    async def _coordinator(self, admin: Any, wait_s: float, other_than: int | None) -> int | None:
        """The group's coordinator as the cluster answers now (another than `other_than`),
        asked until `wait_s` passes: during a failover the answer is an error."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                node = int(await admin.find_coordinator(self.group))
                if node != other_than and self.cluster.running(node):
                    return node
            except Exception:  # not available yet: a coordinator is being elected
                pass
            await asyncio.sleep(0.5)
        return None

    async def kill_coordinator(self, check: Callable[[], None]) -> None:
        admin = clients.admin(self.cluster.bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            node = await self._coordinator(admin, 60, None)
            if node is None:
                self.kills.append({"at_s": round(self._now(), 1), "error": "no coordinator"})
                return
            at = self._now()
            await asyncio.to_thread(self.cluster.kill, node)
            self.say(f"storm: broker {node} (the group's coordinator) SIGKILLed at {at:.0f} s")
            moved = await self._coordinator(admin, 90, node)
            moved_s = self._now() - at
            while self._now() < at + self.down_s:
                check()
                await asyncio.sleep(0.5)
            began = self._now()
            restart = asyncio.create_task(asyncio.to_thread(self.cluster.start_node, node))
            while not restart.done():
                check()
                await asyncio.sleep(0.5)
            error = None
            try:
                await restart
            except Exception as exc:  # reported: a broker that will not come back
                error = repr(exc)[:300]
            self.kills.append(
                {
                    "node": node,
                    "at_s": round(at, 2),
                    "coordinator_after": moved,
                    "failover_s": round(moved_s, 2) if moved is not None else None,
                    "restarted_at_s": round(self._now(), 2),
                    "restart_took_s": round(self._now() - began, 2),
                    "restart_error": error,
                }
            )
            self.say(
                f"storm: the group moved to broker {moved} in {moved_s:.1f} s; "
                f"broker {node} back at {self._now():.0f} s"
            )
        finally:
            await admin.close()

    def report(
        self, owned: list[tuple[float, frozenset[int]]], partitions: int, stop: float
    ) -> list[Any]:
        """Each kill, with the longest time a partition had no open unit in the 60 s
        after it, before the stop (a processor kill in that window weighs too)."""
        for kill in self.kills:
            if "node" in kill:
                after = unowned(owned, partitions, kill["at_s"], min(stop, kill["at_s"] + 60))
                kill["max_unowned_s_within_60s"] = after["max_unowned_s"]
        return self.kills
