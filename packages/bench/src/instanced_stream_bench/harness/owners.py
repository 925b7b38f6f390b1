"""Which input partitions each running processor has open, polled while a run goes on:
every ~0.5 s each live member's `/readyz` (its units per assigned partition: `open`
serves; restoring and failing do not). The raw answers are kept, per poll and member, so
the longest time a partition had no open unit anywhere in the group (harness/progress.py)
is measured while the processors run, never inferred after the stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from instanced_stream_bench.harness.background import Background
from instanced_stream_bench.harness.chaos import uncommitted_at
from instanced_stream_bench.harness.fleet import Group, Life

__all__ = ["OPEN", "Owners", "uncommitted"]

# A unit that serves. `running` is the lifecycle's name for it (runtime/units/lifecycle.py),
# in case readiness says that instead of `open`.
OPEN = frozenset({"open", "running"})


def _port(life: Life) -> str:
    return life.proc.env.get("STREAM_WEB_PORT", "0")


class Owners(Background):
    """Polls the group's running members in a background task while `async with` runs;
    `samples` holds (seconds since `origin`, {life: open partitions, None when it did not
    answer})."""

    def __init__(self, group: Group, origin: float, every_s: float = 0.5) -> None:
        self.group = group
        self.origin = origin
        self.every_s = every_s
        self.samples: list[tuple[float, dict[str, list[int] | None]]] = []
        self.failed = 0

    def latest(self) -> set[int]:
        """The partitions open anywhere at the last poll."""
        if not self.samples:
            return set()
        return {p for parts in self.samples[-1][1].values() if parts for p in parts}

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, 2 * self.every_s))
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                began = time.monotonic()
                lives = list(self.group.running.values())
                answers = await asyncio.gather(*(self._ask(http, life) for life in lives))
                self.samples.append(
                    (
                        began - self.origin,
                        {life.name: a for life, a in zip(lives, answers, strict=True)},
                    )
                )
                self.failed += sum(a is None for a in answers)
                await asyncio.sleep(max(0.05, self.every_s - (time.monotonic() - began)))

    async def _ask(self, http: aiohttp.ClientSession, life: Life) -> list[int] | None:
        url = f"http://127.0.0.1:{_port(life)}/readyz"
        try:
            async with http.get(url) as resp:  # 503 while not ready: its body still says
                body: dict[str, Any] = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None  # not serving yet, killed, or too busy to answer in time
        parts = body.get("partitions") or {}
        return sorted(int(p) for p, v in parts.items() if v.get("state") in OPEN)


async def uncommitted(life: Life, wait_s: float) -> dict[str, int]:
    """Once `life` owns a partition with consumed records not yet committed (as the chaos
    demo aims): those records per partition; empty when not within `wait_s`."""
    return await uncommitted_at(_port(life), wait_s)
