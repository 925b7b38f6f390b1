"""The lifecycle of each input partition this member was given (docs/architecture.md,
`Lifecycle`): one state per partition with its transitions checked in one place, as
Kafka Streams' `Task.State`. Every other structure is a view of it: the running units
(`running`, what the fetch loop, the stager and the producers' renewal read), the
openings (`opening`, what readiness, lag and the back-off read), the suspended ones.

    ASSIGNED -> RESTORING -> RUNNING -> SUSPENDED -> RUNNING       (given back, same epoch)
                    |  ^         |          |
                    v  |         v          +----> CLOSED          (moved away, or a newer
                  FAILED <-------+                                  epoch came between)
                    (reopened after a back-off)

A restore under way survives a revocation (RESTORING -> SUSPENDED -> RESTORING): the
eager protocol revokes every partition at every rebalance, and restarting each restore
from zero then kept large stores from ever opening under churn. A suspended partition
resumes only under the assignment epoch that follows the one it was suspended under: any
other means another member may have owned it in between, so it is closed and opened anew
(fenced, restored from the changelog).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from instanced_stream.errors import StreamError
from instanced_stream.runtime.units.unit import Unit

__all__ = ["IllegalTransition", "Lifecycle", "Opening", "PartitionTask", "UnitState"]


class UnitState(Enum):
    ASSIGNED = "assigned"  # given by the group, its opening not begun
    RESTORING = "restoring"  # its producer started (fencing), its store restoring, sought
    RUNNING = "running"  # takes work
    SUSPENDED = "suspended"  # revoked: kept (a unit that ran, or its restore) until told
    FAILED = "failed"  # did not open, or failed while running: opened again after a back-off
    CLOSED = "closed"  # gone from this member


_NEXT: dict[UnitState, frozenset[UnitState]] = {
    UnitState.ASSIGNED: frozenset({UnitState.RESTORING, UnitState.CLOSED}),
    UnitState.RESTORING: frozenset(
        {UnitState.RUNNING, UnitState.SUSPENDED, UnitState.FAILED, UnitState.CLOSED}
    ),
    UnitState.RUNNING: frozenset({UnitState.SUSPENDED, UnitState.FAILED, UnitState.CLOSED}),
    UnitState.SUSPENDED: frozenset({UnitState.RUNNING, UnitState.RESTORING, UnitState.CLOSED}),
    UnitState.FAILED: frozenset({UnitState.RESTORING, UnitState.SUSPENDED, UnitState.CLOSED}),
    UnitState.CLOSED: frozenset(),
}

# Where a unit that ran, or one an opening started, still serves.
_SERVING = frozenset({UnitState.RUNNING, UnitState.SUSPENDED})
_OPENING = frozenset({UnitState.RESTORING, UnitState.SUSPENDED})


@dataclass(eq=False)
class Opening:
    """The opening of a partition's unit (runtime/units/opening.py): its task, the unit
    once its producer started, and, failed, when it is tried again. While its partition
    is suspended it waits before it seeks the consumer (`Lifecycle.unsuspended`: a seek
    during a rebalance finds the partition unassigned)."""

    partition: int
    since: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    unit: Unit | None = None  # once its producer started
    failed: BaseException | None = None
    retry_at: float = 0.0
    failures: int = 0

    def view(self, now: float, restored: int) -> dict[str, Any]:
        """What readiness and the live page say about it."""
        if self.failed is not None and self.task is None:
            return {
                "state": "failing",
                "error": repr(self.failed)[:300],
                "failures": self.failures,
                "retry_in_s": round(max(0.0, self.retry_at - now), 1),
            }
        return {"state": "restoring", "for_s": round(now - self.since, 1), "restored": restored}


class IllegalTransition(StreamError):
    """A partition asked to move where its lifecycle does not go (a bug)."""


@dataclass(eq=False)
class PartitionTask:
    """One partition's place in its lifecycle. `unit`: while RUNNING, and SUSPENDED after
    running; `opening`: while RESTORING or FAILED, and SUSPENDED while its restore goes
    on. `epoch`: the assignment epoch it is held under."""

    partition: int
    state: UnitState = UnitState.ASSIGNED
    epoch: int = -1
    unit: Unit | None = None
    opening: Opening | None = None
    since: float = field(default_factory=time.monotonic)


class _View(Mapping[int, Any]):
    """A read-only view of the partitions in some states: partition -> what `pick` takes
    of each (its unit, its opening)."""

    def __init__(self, tasks: dict[int, PartitionTask], states: frozenset[UnitState], attr: str):
        self._tasks, self._states, self._attr = tasks, states, attr

    def _picked(self, task: PartitionTask | None) -> Any:
        if task is None or task.state not in self._states:
            return None
        return getattr(task, self._attr)

    def __getitem__(self, p: int) -> Any:
        found = self._picked(self._tasks.get(p))
        if found is None:
            raise KeyError(p)
        return found

    def __iter__(self) -> Iterator[int]:
        return iter([p for p, t in sorted(self._tasks.items()) if self._picked(t) is not None])

    def __len__(self) -> int:
        return sum(1 for t in self._tasks.values() if self._picked(t) is not None)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class Lifecycle:
    """Every partition given to this member, by number, each in one `UnitState`."""

    def __init__(self) -> None:
        self.tasks: dict[int, PartitionTask] = {}
        # The views: what the rest of the engine reads. None is written to directly.
        self.running: Mapping[int, Unit] = _View(self.tasks, frozenset({UnitState.RUNNING}), "unit")
        self.opening: Mapping[int, Opening] = _View(
            self.tasks, frozenset({UnitState.RESTORING, UnitState.FAILED}), "opening"
        )
        self._moved = asyncio.Event()  # set, and replaced, at every move

    async def unsuspended(self, p: int) -> None:
        """Returns once partition `p` is not suspended (at once if it is not)."""
        while self.state(p) is UnitState.SUSPENDED:
            await self._moved.wait()

    def holds(self, unit: Unit) -> bool:
        """Whether `unit` serves its partition here: the partition's running or suspended
        unit, or the unit its opening (restoring, or suspended while restoring) started.
        The one answer to whether a unit is void (`Unit.held` asks it)."""
        task = self.tasks.get(unit.partition)
        if task is None:
            return False
        if task.unit is unit:
            return task.state in _SERVING
        opening = task.opening
        return opening is not None and opening.unit is unit and task.state in _OPENING

    def state(self, p: int) -> UnitState | None:
        task = self.tasks.get(p)
        return None if task is None else task.state

    def get(self, p: int) -> PartitionTask | None:
        return self.tasks.get(p)

    def in_state(self, *states: UnitState) -> list[PartitionTask]:
        return [t for _p, t in sorted(self.tasks.items()) if t.state in states]

    def move(self, p: int, to: UnitState, **changes: Any) -> PartitionTask:
        """Moves partition `p` to `to` (a new partition starts ASSIGNED), setting the
        task's other fields given; CLOSED forgets it. Raises `IllegalTransition`."""
        task = self.tasks.get(p)
        if task is None:
            if to is not UnitState.ASSIGNED:
                raise IllegalTransition(f"partition {p}: not held here, cannot be {to.value}")
            task = self.tasks[p] = PartitionTask(p, **changes)
            return task
        if to not in _NEXT[task.state]:
            raise IllegalTransition(f"partition {p}: {task.state.value} -> {to.value}")
        task.state, task.since = to, time.monotonic()
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()  # whoever waits for a state looks again
        for name, value in changes.items():
            setattr(task, name, value)
        if to is UnitState.CLOSED:
            del self.tasks[p]
        return task
