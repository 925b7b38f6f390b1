"""What the processors' JSON logs say about rebalances: aiokafka's "Setting newly
assigned partitions" opens an assignment, the processor's "N states restored" line closes
each partition's restore and "rebalance: partitions [...] assigned" (or "resumed, ...
opening") the callback; a member
put out of the group rejoins under a new member id."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from instanced_stream_bench.harness.fleet import Group, Life

__all__ = [
    "LogFacts",
    "from_logs",
    "group_facts",
    "parse_log",
    "rebalance_times",
    "wait_assigned",
]

_ASSIGNING = "Setting newly assigned partitions"


_RESTORED = re.compile(r"partition (\d+): (\d+) states restored")


# The callback's last line: "... [..] assigned" (restores inside it, engines before issue
# 37) or "... [..] resumed, [..] closed, [..] opening" (restores as tasks after it).
_ASSIGNED = re.compile(r"rebalance: partitions \[([\d, ]*)\] (?:assigned|resumed)")


_JOINED = re.compile(r"with member_id (\S+)")


_UNKNOWN = "member_id was not recognized"


_GENERATION = re.compile(r"Joined group '([^']*)' \(generation (\d+)\)")


@dataclass(slots=True)
class LogFacts:
    """What one processor's JSON log says about its rebalances (times: epoch seconds)."""

    member_ids: list[str] = field(default_factory=list)
    revoking: list[float] = field(default_factory=list)  # each rebalance's start here
    unknown_member: int = 0
    # per assignment: when its callback began, each partition's restore, when it ended
    assignments: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def expulsions(self) -> int:
        return max(0, len(dict.fromkeys(self.member_ids)) - 1)


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def parse_log(path: Path) -> LogFacts:
    facts = LogFacts()
    current: dict[str, Any] | None = None
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return facts
    for line in lines:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if b"Traceback" in line or b"Error" in line:
                facts.errors.append(line.decode(errors="replace")[:200])
            continue
        if not isinstance(rec, dict):
            continue
        msg = str(rec.get("message", ""))
        at = _epoch(rec["ts"]) if "ts" in rec else 0.0
        if rec.get("level") in ("ERROR", "CRITICAL"):
            facts.errors.append(msg[:200])
        if _UNKNOWN in msg:
            facts.unknown_member += 1
        if (joined := _JOINED.search(msg)) and "Joined group" in msg:
            facts.member_ids.append(joined[1])
        elif msg.startswith("Revoking previously assigned partitions"):
            facts.revoking.append(at)
        elif msg.startswith(_ASSIGNING):
            current = {"began": at, "restored": {}, "ended": None}
            facts.assignments.append(current)
        elif (restored := _RESTORED.search(msg)) and current is not None:
            current["restored"][int(restored[1])] = (at, int(restored[2]))
        elif _ASSIGNED.search(msg) and current is not None:
            current["ended"] = at
    return facts


def group_facts(path: Path, group: str) -> tuple[float | None, dict[int, float]]:
    """From one processor's JSON log, for `group`: when its first assignment began
    (aiokafka's "Setting newly assigned partitions", epoch seconds; None: never) and each
    generation it joined, with when (aiokafka's "Joined group 'g' (generation N)")."""
    first: float | None = None
    generations: dict[int, float] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None, generations
    for line in lines:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or "ts" not in rec:
            continue
        msg = str(rec.get("message", ""))
        if first is None and msg.startswith(_ASSIGNING) and msg.endswith(f" {group}"):
            first = _epoch(rec["ts"])
        elif (joined := _GENERATION.search(msg)) and joined[1] == group:
            generations.setdefault(int(joined[2]), _epoch(rec["ts"]))
    return first, generations


def rebalance_times(moves: list[dict[str, Any]], lives: list[Life], wall_origin: float) -> None:
    """Each move's first revocation in any processor's log: the rebalance began there
    (a scale-up's processes first start, import and probe the model), and the resume
    counted from it."""
    revokes = sorted(
        at - wall_origin for life in lives for at in parse_log(life.proc.log_path).revoking
    )
    for k, move in enumerate(moves):
        nxt = moves[k + 1]["at_s"] if k + 1 < len(moves) else float("inf")
        began = next((r for r in revokes if move["at_s"] <= r < nxt), None)
        move["rebalance_began_s"] = None if began is None else round(began, 1)
        resume = move.get("resume_s")
        move["resume_after_rebalance_s"] = (
            None
            if began is None or resume is None
            else round(max(0.0, move["at_s"] + resume - began), 1)
        )


def from_logs(lives: list[Life], wall_origin: float) -> dict[str, Any]:
    restore: list[dict[str, Any]] = []
    processors: list[dict[str, Any]] = []
    expulsions = 0
    for life in lives:
        facts = parse_log(life.proc.log_path)
        expulsions += facts.expulsions
        for a in facts.assignments:
            parts = {
                str(p): {"s": round(at - a["began"], 2), "states": n}
                for p, (at, n) in sorted(a["restored"].items())
            }
            restore.append(
                {
                    "processor": life.name,
                    "at_s": round(a["began"] - wall_origin, 1),
                    "callback_s": None if a["ended"] is None else round(a["ended"] - a["began"], 2),
                    "partitions": len(parts),
                    "states": sum(v["states"] for v in parts.values()),
                    "per_partition": parts,
                }
            )
        processors.append(
            {
                "name": life.name,
                "started_s": round(life.started_s, 1),
                "stopped_s": None if life.stopped_s is None else round(life.stopped_s, 1),
                "peak_rss_mb": round(life.peak_rss_mb, 1),
                "exit_code": life.exit_code,
                "needed_sigkill": life.killed,
                "expulsions": facts.expulsions,
                "unknown_member_lines": facts.unknown_member,
                "assignments": len(facts.assignments),
                "errors": facts.errors[:5],
                "log": str(life.proc.log_path),
            }
        )
    restores = [r for r in restore if r["partitions"]]
    return {
        "expulsions": expulsions,
        "restore_s": restores,
        "restore_max_callback_s": max(
            (r["callback_s"] for r in restores if r["callback_s"] is not None), default=None
        ),
        "assignments_unfinished": sum(1 for r in restore if r["callback_s"] is None),
        "rss_mb": {p["name"]: p["peak_rss_mb"] for p in processors},
        "processors": processors,
    }


async def wait_assigned(group: Group, until: float) -> bool:
    """Until every running processor's log shows an assignment callback finished."""
    while time.monotonic() < until:
        group.sample()
        if all(
            any(a["ended"] for a in parse_log(life.proc.log_path).assignments)
            for life in group.running.values()
        ):
            return True
        await asyncio.sleep(0.5)
    return False
