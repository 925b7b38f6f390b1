"""The restart storm's kills (tools/storm.py): a random member of a group SIGKILLed and
started again, by turns aimed inside a commit (its live API shows consumed records not
yet committed, as the chaos demo aims), at a random moment, and while the restarted
member joins (its log shows its join request and no assignment yet). Each kill is noted
with its phase as found; a member that exits on its own is a crash, started again too."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from instanced_stream.tools.coordinator import BrokerKiller
from instanced_stream.tools.fleet import Group, Life
from instanced_stream.tools.owners import uncommitted

if TYPE_CHECKING:
    from instanced_stream.tools.storm import StormPlan

__all__ = ["Kills"]

Say = Callable[[str], None]


class Kills:
    """Kills and restarts members of `group`, and notes what happened to each."""

    def __init__(self, group: Group, gid: str, plan: StormPlan, origin: float, say: Say) -> None:
        self.group, self.gid, self.plan, self.origin, self.say = group, gid, plan, origin, say
        self.rng = random.Random(plan.seed)
        self.kills: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.monotonic() - self.origin

    def check(self) -> None:
        """Lives that ended on their own are crashes; their slot starts again."""
        self.group.sample()
        for life in self.group.exited():
            self.crashes.append(
                {"processor": life.name, "at_s": round(self.now(), 1), "code": life.exit_code}
            )
            self.say(f"storm: {life.name} exited on its own ({life.exit_code}); restarting")
            slot = int(life.name[1:].split(".")[0])
            self.group.start(slot)

    async def wait(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.check()
            await asyncio.sleep(min(0.5, max(0.0, until - time.monotonic())))

    async def kill(self, slot: int, phase: str, found: dict[str, int] | None = None) -> Life:
        """SIGKILL the slot's life (no drain, no commit) and start it again."""
        self.check()
        life = self.group.running.get(slot)
        if life is None or life.proc.proc is None:
            return self.group.start(slot)
        started = life.started_s
        await asyncio.to_thread(life.proc.kill)
        life.stopped_s = self.now()
        life.exit_code = life.proc.proc.returncode
        del self.group.running[slot]
        self.kills.append(
            {
                "k": len(self.kills) + 1,
                "at_s": round(life.stopped_s, 2),
                "processor": life.name,
                "phase": phase,
                "age_s": round(life.stopped_s - started, 2),
                "uncommitted": found or {},
            }
        )
        self.say(f"storm: kill {len(self.kills)} {life.name} ({phase}) at {life.stopped_s:.0f} s")
        return self.group.start(slot)

    async def aimed(self, slot: int) -> Life:
        life = self.group.running.get(slot)
        found = await uncommitted(life, self.plan.aim_s) if life is not None else {}
        return await self.kill(slot, "in_commit" if found else "running", found)

    async def joining(self, life: Life, slot: int) -> None:
        """Kill `life` (just started) once its log shows its join request and before its
        first assignment; its phase says what it was really doing."""
        deadline = time.monotonic() + self.plan.join_wait_s
        phase = "starting"
        while time.monotonic() < deadline:
            self.check()
            if self.group.running.get(slot) is not life:
                return  # it crashed meanwhile: noted as such
            text = _read(life.proc.log_path)
            if b"Setting newly assigned partitions" in text:
                phase = "running"  # too late: it got in first
                break
            if f"joining group {self.gid}".encode() in text:
                await asyncio.sleep(self.rng.uniform(0.0, 1.0))
                text = _read(life.proc.log_path)
                phase = "running" if b"Setting newly assigned partitions" in text else "joining"
                break
            await asyncio.sleep(0.1)
        await self.kill(slot, phase)

    async def run(self, brokers: BrokerKiller | None, until: float) -> None:
        """`restarts` kills by turns: aimed inside a commit; at a random moment; a pair,
        the second while the restarted member joins. Broker kills fall between them."""
        plan = self.plan
        broker_at = {
            round(plan.restarts * (j + 1) / (plan.broker_kills + 1))
            for j in range(plan.broker_kills if brokers is not None else 0)
        }
        turn = 0
        while len(self.kills) < plan.restarts and time.monotonic() < until:
            if brokers is not None and broker_at and len(self.kills) >= min(broker_at):
                broker_at.discard(min(broker_at))
                await brokers.kill_coordinator(self.check)
                await self.wait(self.rng.uniform(*plan.gap_s))
            slot = self.rng.choice(sorted(self.group.running) or [0])
            manner = turn % 3
            turn += 1
            if manner == 0:
                await self.aimed(slot)
            elif manner == 1:
                await self.wait(self.rng.uniform(0, 3))
                await self.kill(slot, "running")
            else:
                fresh = await self.aimed(slot)
                if len(self.kills) < plan.restarts:
                    await self.joining(fresh, slot)
            await self.wait(self.rng.uniform(*plan.gap_s))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
