"""`stream demo --chaos N`: processors are killed with SIGKILL N times at random moments
while the demo runs, and restarted each time, so a user can watch the guarantees hold:
the audit afterwards still finds every item accounted for. With two processors in the
group, every kill and restart also moves partitions between them (a rebalance)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Chaos"]


class Process(Protocol):
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
    done: list[float] = field(default_factory=list)  # seconds into the run of each kill

    async def run(self) -> None:
        rng = random.Random(self.seed)
        started = time.monotonic()
        await asyncio.sleep(rng.uniform(0.5, self.first_s))
        for k in range(self.kills):
            if k:
                await asyncio.sleep(rng.uniform(*self.between_s))
            victim = rng.randrange(len(self.procs))
            await asyncio.to_thread(self.procs[victim].kill)  # SIGKILL: no drain, no commit
            self.done.append(round(time.monotonic() - started, 1))
            self.say(
                f"chaos: SIGKILL {k + 1} of {self.kills} (processor {victim + 1}) at "
                f"{self.done[-1]}s; restarting"
            )
            self.procs[victim].start()

    def summary(self) -> dict[str, Any]:
        return {
            "processors": len(self.procs),
            "kills_asked": self.kills,
            "kills_done": len(self.done),
            "at_s": self.done,
            "seed": self.seed,
        }
