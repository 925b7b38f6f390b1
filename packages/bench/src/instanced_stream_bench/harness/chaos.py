"""`stream demo --chaos N`: processors are killed with SIGKILL N times at random moments
while the demo runs, and restarted each time, so a user can watch the guarantees hold:
the audit afterwards still finds every item accounted for. With two processors in the
group, every kill and restart also moves partitions between them (a rebalance).

Each kill is aimed: the victim is killed as soon as its live API shows it owning a
partition with consumed records not yet committed (within `aim_s`; then it is killed
anyway), and the summary says how many kills found such work."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

__all__ = ["Chaos", "uncommitted_at"]


class Process(Protocol):
    env: dict[str, str]  # STREAM_WEB_PORT: where its live API answers

    def kill(self) -> None: ...

    def start(self) -> None: ...


@dataclass(slots=True)
class Chaos:
    """Kills one of `procs` (chosen at random) `kills` times, the first within `first_s` of
    the start and each next one after the restarted processor has had `between_s` to get
    going again."""

    procs: list[Process]
    kills: int
    say: Callable[[str], None]
    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**32))
    first_s: float = 3.0
    between_s: tuple[float, float] = (6.0, 12.0)
    aim_s: float = 5.0
    done: list[float] = field(default_factory=list)  # seconds into the run of each kill
    with_work: int = 0  # kills that found the victim owning uncommitted records

    async def run(self) -> None:
        rng = random.Random(self.seed)
        started = time.monotonic()
        await asyncio.sleep(rng.uniform(0.5, self.first_s))
        for k in range(self.kills):
            if k:
                await asyncio.sleep(rng.uniform(*self.between_s))
            victim = rng.randrange(len(self.procs))
            work = await uncommitted_at(
                self.procs[victim].env.get("STREAM_WEB_PORT", 0), self.aim_s
            )
            await asyncio.to_thread(self.procs[victim].kill)  # SIGKILL: no drain, no commit
            self.done.append(round(time.monotonic() - started, 1))
            self.with_work += bool(work)
            self.say(
                f"chaos: SIGKILL {k + 1} of {self.kills} (processor {victim + 1}) at "
                f"{self.done[-1]}s, uncommitted records per partition {work}; restarting"
            )
            self.procs[victim].start()

    def summary(self) -> dict[str, Any]:
        return {
            "processors": len(self.procs),
            "kills_asked": self.kills,
            "kills_done": len(self.done),
            "kills_with_work": self.with_work,
            "at_s": self.done,
            "seed": self.seed,
        }


async def uncommitted_at(port: int | str, wait_s: float) -> dict[str, int]:
    """Once the processor serving its live API on `port` owns a partition with consumed
    records not yet committed (the API's `units`): those records per partition; empty
    when not within `wait_s`."""
    url = f"http://127.0.0.1:{port}/api/live"
    deadline = time.monotonic() + wait_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as resp:
                    units: dict[str, int] = (await resp.json()).get("units", {})
            except (aiohttp.ClientError, TimeoutError, ValueError):
                units = {}  # restarting, not serving yet
            if sum(units.values()) > 0:
                return units
            await asyncio.sleep(0.05)
    return {}
