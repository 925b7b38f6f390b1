"""When each workflow state next needs the expiry timer: its earliest pending deadline, or
its end plus the retention (a finished workflow is forgotten then). The timer asks for the
states that are due instead of reading (and copying) every state twice a second.

Each partition keeps its states' due times in a heap, earliest first, so a tick looks at
the top of each owned partition's heap and stops at the first time still to come: a tick
with nothing due costs one comparison a partition, however many states are indexed. A
state rescheduled or forgotten leaves its old heap entry behind (lazy deletion): an entry
counts only while it matches the state's current due time, and a stale one is discarded
when it reaches the top. A partition restored again is indexed anew in bounded chunks
(`reindex`), so the event loop that fetches, commits and heartbeats is never held long.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable

from instanced_stream.core.state import InstanceState, StateStore

__all__ = ["CHUNK", "MOST_PER_TICK", "DueIndex", "forget_retired"]

# States indexed between two yields to the event loop while a partition is re-indexed.
CHUNK = 2_000

# Due states one tick hands out at most; the rest come with the next tick. A restore after
# a long stop can find a whole partition past its retention at once, and each due state
# costs the caller a change: one tick must not take them all.
MOST_PER_TICK = 10_000


class _Partition:
    """One partition's due times: the current one of each state, and the heap of entries
    (some stale) that finds the earliest without visiting the rest."""

    __slots__ = ("heap", "when")

    def __init__(self) -> None:
        self.when: dict[str, float] = {}
        self.heap: list[tuple[float, str]] = []

    def set(self, instance: str, when: float) -> None:
        if self.when.get(instance) == when:
            return  # already there: no second entry
        self.when[instance] = when
        heapq.heappush(self.heap, (when, instance))
        if len(self.heap) > 2 * len(self.when) + 64:
            self._compact()

    def _compact(self) -> None:
        """Mostly stale entries (states rescheduled again and again): rebuilt from the
        current times, so the heap never grows past twice the states it indexes."""
        self.heap = [(when, name) for name, when in self.when.items()]
        heapq.heapify(self.heap)

    def take(self, now: float, most: int, out: list[tuple[str, int]], partition: int) -> None:
        heap, when = self.heap, self.when
        while heap and heap[0][0] < now and len(out) < most:
            at, name = heapq.heappop(heap)
            if when.get(name) == at:  # else stale: rescheduled or forgotten since
                del when[name]
                out.append((name, partition))


class DueIndex:
    """Kept by every put and delete of the workflow; built from the store (`rebuild`) when
    the store holds states the workflow did not put, and a partition's part of it again
    (`reindex`) when that partition is restored from its changelog.

    A state is indexed under the partition it names; an instance always lives on its home
    partition, and one found elsewhere when due is put back where its state says."""

    def __init__(self, retention_s: float) -> None:
        self.retention_s = retention_s
        self.built = False
        self._parts: dict[int, _Partition] = {}
        self._ticks = 0  # where the next tick starts: each partition comes first in turn

    def __len__(self) -> int:
        return sum(len(part.when) for part in self._parts.values())

    def due_at(self, st: InstanceState) -> float | None:
        times = [p.deadline for p in st.pending.values()]
        if st.ended is not None and st.status == "done":
            times.append(st.ended.at + self.retention_s)
        return min(times) if times else None

    def update(self, st: InstanceState) -> None:
        when = self.due_at(st)
        if when is None:
            self.drop(st.instance, st.partition)
        else:
            self._set(st.instance, when, st.partition)

    def retire(self, instance: str, ended_at: float, partition: int) -> None:
        self._set(instance, ended_at + self.retention_s, partition)

    def _set(self, instance: str, when: float, partition: int) -> None:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        part.set(instance, when)

    def drop(self, instance: str, partition: int) -> None:
        part = self._parts.get(partition)
        if part is not None:
            part.when.pop(instance, None)  # its heap entry turns stale

    def clear(self, partition: int) -> None:
        """Forgets `partition`'s states (its store left this process, or is re-indexed)."""
        self._parts.pop(partition, None)

    def rebuild(
        self, states: Iterable[InstanceState], retired: Iterable[tuple[str, float, int]] = ()
    ) -> None:
        """From the live states and the retired ones (instance, ended at, partition), at
        once: for a store filled without the workflow (the runtime's stores are indexed
        partition by partition as they are restored: `reindex`)."""
        self._parts = {}
        for st in states:
            self.update(st)
        for retiree in retired:
            self.retire(*retiree)
        self.built = True

    async def reindex(
        self,
        partition: int,
        states: Iterable[InstanceState],
        retired: Iterable[tuple[str, float, int]],
        chunk: int = CHUNK,
    ) -> None:
        """`partition` indexed anew from its restored store: its live states and its
        retired ones, yielding to the event loop every `chunk` states. The index counts
        as built from here on: the restores index every partition they add."""
        self.built = True
        self.clear(partition)
        for n, st in enumerate(states):
            if n % chunk == chunk - 1:
                await asyncio.sleep(0)
            self.update(st)
        for n, (instance, ended_at, part) in enumerate(retired):
            if n % chunk == chunk - 1:
                await asyncio.sleep(0)
            self.retire(instance, ended_at, part)

    def due(
        self, now: float, owns: Callable[[int], bool], most: int = MOST_PER_TICK
    ) -> list[tuple[str, int]]:
        """Owned states due before `now` with their partitions, at most `most`, earliest
        first in each partition. They leave the index: the caller puts back (`update`,
        `retire`) what stays."""
        out: list[tuple[str, int]] = []
        parts = list(self._parts.items())
        # A tick that stops at `most` starts the next one a partition later, so a partition
        # with a flood of due states (a long stop) delays the others' deadlines by no more
        # than a tick each.
        start, self._ticks = self._ticks % max(len(parts), 1), self._ticks + 1
        for partition, part in parts[start:] + parts[:start]:
            if len(out) >= most:
                break
            if part.heap and part.heap[0][0] < now and owns(partition):
                part.take(now, most, out, partition)
        return out


def forget_retired(
    store: StateStore,
    index: DueIndex,
    name: str,
    partition: int,
    now: float,
    owns: Callable[[int], bool],
) -> bool:
    """A due state (of `partition`) the store keeps out of memory (a finished workflow's):
    deleted once its retention is over, without reading it back. False: `name` is not such
    a state."""
    ended_at = store.retired_at(name)
    if ended_at is None:
        return False
    if not owns(partition):
        pass  # a moved workflow is its new owner's: it left the index when it fell due
    elif ended_at < now - index.retention_s:
        store.delete(name, partition)
    else:  # due by an older time than its end's (a deadline it had): due again later
        index.retire(name, ended_at, partition)
    return True
