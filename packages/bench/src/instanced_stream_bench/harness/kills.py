"""The restart storm's kills (harness/storm.py): a random member of a group SIGKILLed and
started again, by turns aimed inside a commit (its live API shows consumed records not
yet committed, as the chaos demo aims), at a random moment, and while the restarted
member joins: by turns from outside (its log shows its join request and no assignment
yet) and by its own `joined` fault point (the group answered its join with partitions it
has not taken yet: a static member's join takes tens of milliseconds, which a kill from
outside rarely meets). Every other aimed kill also arms the restarted member's
`mid_commit` fault point, so it kills itself inside a commit's transaction. Each kill is
noted with its phase as found; a member that exits on its own otherwise is a crash,
started again too."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from instanced_stream_bench.harness.coordinator import BrokerKiller
from instanced_stream_bench.harness.fleet import Group, Life
from instanced_stream_bench.harness.owners import uncommitted

__all__ = ["KillPlan", "Kills"]

# What an armed fault point logs as it kills its process (testing/faults.py), and the
# phase each point's kill is noted under.
_FAULT_KILL = re.compile(rb"fault injection: SIGKILL at (\w+)")
_FAULT_PHASE = {b"mid_commit": "mid_commit", b"joined": "joining"}

Say = Callable[[str], None]


class KillPlan(Protocol):
    """What the kills read of the storm's plan (`harness/storm.py`'s `StormPlan`); times in
    seconds."""

    seed: int  # of the kills' random draws
    restarts: int  # members killed in all
    gap_s: tuple[float, float]  # the pause between two kills, drawn between these
    aim_s: float  # a kill aimed inside a commit waits this long for one
    join_wait_s: float  # a restarted member's join request, at most
    broker_kills: int  # the group coordinator killed this often, between the kills


class Kills:
    """Kills and restarts members of `group`, and notes what happened to each."""

    def __init__(self, group: Group, gid: str, plan: KillPlan, origin: float, say: Say) -> None:
        self.group, self.gid, self.plan, self.origin, self.say = group, gid, plan, origin, say
        self.rng = random.Random(plan.seed)
        self.kills: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.monotonic() - self.origin

    def check(self) -> None:
        """Lives that ended on their own are crashes, unless an armed fault point killed
        them inside a commit (a kill, phase `mid_commit`); their slot starts again."""
        self.group.sample()
        for life in self.group.exited():
            slot = int(life.name[1:].split(".")[0])
            fault = _FAULT_KILL.search(_read(life.proc.log_path))
            if fault is not None and fault[1] in _FAULT_PHASE:
                self._note(life, _FAULT_PHASE[fault[1]], {}, fault[1].decode())
            else:
                self.crashes.append(
                    {"processor": life.name, "at_s": round(self.now(), 1), "code": life.exit_code}
                )
                self.say(f"storm: {life.name} exited on its own ({life.exit_code}); restarting")
            self.group.start(slot)

    def _note(
        self, life: Life, phase: str, found: dict[str, int], fault: str | None = None
    ) -> None:
        at = self.now() if life.stopped_s is None else life.stopped_s
        self.kills.append(
            {
                "k": len(self.kills) + 1,
                "at_s": round(at, 2),
                "processor": life.name,
                "phase": phase,
                "fault_point": fault,  # the member killed itself there; None: from outside
                "age_s": round(at - life.started_s, 2),
                "uncommitted": found,
            }
        )
        self.say(f"storm: kill {len(self.kills)} {life.name} ({phase}) at {at:.0f} s")

    async def wait(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.check()
            await asyncio.sleep(min(0.5, max(0.0, until - time.monotonic())))

    async def kill(
        self,
        slot: int,
        phase: str,
        found: dict[str, int] | None = None,
        fault: str | None = None,
        classify: bool = False,
    ) -> Life:
        """SIGKILL the slot's life (no drain, no commit) and start it again; `fault`: the
        new life kills itself at that fault point (testing/faults.py): `mid_commit` at
        its first to third commit, inside the transaction; `joined` at its first join's
        answer, before it takes its partitions. `classify`: the phase is what the
        dead life's log shows it reached: `starting` before its join request, `running`
        once it had an assignment, else `phase`."""
        self.check()
        life = self.group.running.get(slot)
        if life is not None and life.proc.proc is not None:
            await asyncio.to_thread(life.proc.kill)
            life.stopped_s = self.now()
            life.exit_code = life.proc.proc.returncode
            del self.group.running[slot]
            if classify:
                phase = _reached(_read(life.proc.log_path), self.gid, phase)
            self._note(life, phase, found or {})
        env = None
        if fault is not None and len(self.kills) < self.plan.restarts - 1:
            hit = self.rng.randint(1, 3) if fault == "mid_commit" else 1
            env = {"STREAM_CRASH_AT": f"{fault}:{hit}"}
        return self.group.start(slot, env)

    async def aimed(self, slot: int, fault: str | None = None) -> Life:
        life = self.group.running.get(slot)
        found = await uncommitted(life, self.plan.aim_s) if life is not None else {}
        return await self.kill(slot, "in_commit" if found else "running", found, fault)

    async def joining(self, life: Life, slot: int) -> None:
        """Kill `life` (just started) once its log shows its join request and before its
        first assignment; its phase says what it was really doing, read from its log
        after its death. A static member's join takes tens of milliseconds (the broker
        hands back its partitions without a rebalance), so the log is read every 20 ms
        and the kill follows the join request within 0.1 s."""
        deadline = time.monotonic() + self.plan.join_wait_s
        while time.monotonic() < deadline:
            self.check()
            if self.group.running.get(slot) is not life:
                return  # it crashed meanwhile: noted as such
            text = _read(life.proc.log_path)
            if b"Setting newly assigned partitions" in text:
                break  # too late: it got in first
            if f"joining group {self.gid}".encode() in text:
                await asyncio.sleep(self.rng.uniform(0.0, 0.1))
                break
            await asyncio.sleep(0.02)
        await self.kill(slot, "joining", classify=True)

    async def gone(self, life: Life, wait_s: float) -> None:
        """Until `life` has ended (and been noted), or `wait_s` passed."""
        until = time.monotonic() + wait_s
        while time.monotonic() < until and life.stopped_s is None:
            await self.wait(0.5)

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
            # Every other time, the restarted member is armed to die at a fault point
            # (inside a commit; at its join's answer, the first round): that death is the
            # next kill, and the gap runs from it.
            odd_round = (turn // 3) % 2 == 1
            turn += 1
            if manner == 0:
                fresh = await self.aimed(slot, "mid_commit" if odd_round else None)
                if "STREAM_CRASH_AT" in fresh.proc.env:
                    await self.gone(fresh, plan.join_wait_s + 60)
            elif manner == 1:
                await self.wait(self.rng.uniform(0, 3))
                await self.kill(slot, "running")
            elif not odd_round:
                fresh = await self.aimed(slot, "joined")
                if "STREAM_CRASH_AT" in fresh.proc.env:
                    await self.gone(fresh, plan.join_wait_s + 60)
            else:
                fresh = await self.aimed(slot)
                if len(self.kills) < plan.restarts:
                    await self.joining(fresh, slot)
            await self.wait(self.rng.uniform(*plan.gap_s))


def _reached(log: bytes, gid: str, joining: str) -> str:
    if b"Setting newly assigned partitions" in log:
        return "running"
    return joining if f"joining group {gid}".encode() in log else "starting"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
