"""Progress figures of a fault run (progress is judged while the processors run, not
after the stop: docs/performance.md, the restart storm), from its raw timeline: items
decided late, the longest a partition had no open unit, the longest join, rebalances a
minute. Pure functions of what was recorded, every one cut at the stop: a stop's drain
can finish what a stuck group left, so nothing at or after the stop counts in a
figure's favour. Times are seconds on one clock (the run's origin)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Member",
    "decided_late",
    "join_times",
    "owned_over_time",
    "rebalances_per_min",
    "unowned",
]


def decided_late(
    sent: Mapping[tuple[int, int], float],
    first: Mapping[tuple[int, int], float],
    stop: float,
    bound_s: float = 60.0,
) -> dict[str, Any]:
    """An item is on time when its first outcome was visible within `bound_s` of its
    production and before the stop; everything else is late, an item produced less than
    `bound_s` before the stop included when it was not decided before it. Items produced
    at or after the stop are not counted (none should be)."""
    late: list[list[float | int | None]] = []
    counted = 0
    for (p, o), at in sorted(sent.items(), key=lambda kv: kv[1]):
        if at >= stop:
            continue
        counted += 1
        done = first.get((p, o))
        if done is None or done >= stop or done - at > bound_s:
            late.append([p, o, round(at, 3), None if done is None or done >= stop else done])
    return {
        "decided_late": len(late),
        "items_counted": counted,
        "bound_s": bound_s,
        "late_examples": late[:20],  # partition, offset, sent, decided (None: not before stop)
        "late_partitions": sorted({int(x[0]) for x in late if x[0] is not None}),
    }


def owned_over_time(
    samples: Iterable[tuple[float, Mapping[str, list[int] | None]]],
    ended: Mapping[str, float | None],
    stale_s: float = 5.0,
) -> list[tuple[float, frozenset[int]]]:
    """The union of every member's open partitions at each poll. A member whose poll
    failed (None: busy, or not serving yet) keeps its last answer for up to `stale_s`, and
    never past its process's end (`ended`, None while it ran): a loaded event loop that
    misses one poll has not dropped its partitions, a dead one has."""
    last: dict[str, tuple[float, frozenset[int]]] = {}
    out: list[tuple[float, frozenset[int]]] = []
    for at, answers in samples:
        owned: set[int] = set()
        for name, answer in answers.items():
            if answer is not None:
                last[name] = (at, frozenset(answer))
        for name, (seen, held) in last.items():
            end = ended.get(name)
            if end is not None and at >= end:
                continue
            if answers.get(name) is not None or at - seen <= stale_s:
                owned |= held
        out.append((at, frozenset(owned)))
    return out


def unowned(
    owned: list[tuple[float, frozenset[int]]],
    partitions: int,
    start: float,
    stop: float,
) -> dict[str, Any]:
    """Per partition, the spans of polls in [start, stop) at which no member had it open:
    from the first such poll to the next poll that found it open, or to the stop. Polls
    at or after the stop are ignored: a partition a draining member opens does not end
    a span."""
    polls = [(at, parts) for at, parts in owned if start <= at < stop]
    spans: list[tuple[int, float, float]] = []
    for p in range(partitions):
        since: float | None = None
        for at, parts in polls:
            if p in parts:
                if since is not None:
                    spans.append((p, since, at))
                since = None
            elif since is None:
                since = at
        if since is not None:
            spans.append((p, since, stop))
    longest: dict[int, float] = {}
    for p, a, b in spans:
        longest[p] = max(longest.get(p, 0.0), b - a)
    worst = max(longest.values(), default=0.0)
    return {
        "max_unowned_s": round(worst, 1),
        "unowned_per_partition_s": {str(p): round(s, 1) for p, s in sorted(longest.items())},
        # Every span of 1 s or more (partition, from, to): a poll's noise is shorter.
        "unowned_spans": [[p, round(a, 1), round(b, 1)] for p, a, b in spans if b - a >= 1.0],
        "owner_polls": len(polls),
    }


@dataclass(frozen=True, slots=True)
class Member:
    """One process's life: when it started, its first assignment (None: none seen) and
    when it ended (None: it ran until the stop)."""

    name: str
    started: float
    first_assigned: float | None
    ended: float | None


def join_times(members: Iterable[Member], stop: float) -> dict[str, Any]:
    """From each member's start to its first assignment before the stop. A member with
    none counts until it ended (killed, crashed) or until the stop: a member that never
    got in must weigh, not vanish from the figure."""
    per: dict[str, dict[str, Any]] = {}
    for m in members:
        if m.started >= stop:
            continue
        if m.first_assigned is not None and m.first_assigned < stop:
            per[m.name] = {"join_s": round(m.first_assigned - m.started, 2), "assigned": True}
        else:
            end = stop if m.ended is None else min(m.ended, stop)
            per[m.name] = {"join_s": round(end - m.started, 2), "assigned": False}
    assigned = [v["join_s"] for v in per.values() if v["assigned"]]
    return {
        "max_join_s": max((v["join_s"] for v in per.values()), default=None),
        "max_join_assigned_s": max(assigned, default=None),
        "never_assigned": sorted(k for k, v in per.items() if not v["assigned"]),
        "joins": per,
    }


def rebalances_per_min(generations: Mapping[int, float], stop: float) -> dict[str, Any]:
    """Generations are the group's rebalances: each one's first sighting (any member's
    "Joined group ... (generation N)"), those before the stop; the most in any 60 s."""
    times = sorted(at for at in generations.values() if at < stop)
    most = 0
    j = 0
    for i, at in enumerate(times):
        while times[j] <= at - 60.0:
            j += 1
        most = max(most, i - j + 1)
    return {"rebalances_per_min": most, "generations": len(times)}
