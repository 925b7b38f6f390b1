"""When each workflow state next needs the expiry timer: its earliest pending deadline, or
its end plus the retention (a finished workflow is forgotten then). The timer asks for the
states that are due instead of reading (and copying) every state twice a second."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from instanced_stream.core.state import InstanceState, StateStore

__all__ = ["DueIndex", "forget_retired"]


class DueIndex:
    """Kept by every put and delete of the workflow; rebuilt from the store (`rebuild`)
    when the store holds states the workflow did not put (a changelog restore)."""

    def __init__(self, retention_s: float) -> None:
        self.retention_s = retention_s
        self.built = False
        self._due: dict[str, tuple[float, int]] = {}  # instance -> (when, partition)

    def due_at(self, st: InstanceState) -> float | None:
        times = [p.deadline for p in st.pending.values()]
        if st.ended is not None and st.status == "done":
            times.append(st.ended.at + self.retention_s)
        return min(times) if times else None

    def update(self, st: InstanceState) -> None:
        when = self.due_at(st)
        if when is None:
            self._due.pop(st.instance, None)
        else:
            self._due[st.instance] = (when, st.partition)

    def drop(self, instance: str) -> None:
        self._due.pop(instance, None)

    def partition_of(self, instance: str) -> int | None:
        found = self._due.get(instance)
        return found[1] if found is not None else None

    def rebuild(
        self, states: Iterable[InstanceState], retired: Iterable[tuple[str, float, int]] = ()
    ) -> None:
        """From the live states and the retired ones (instance, ended at, partition)."""
        self._due = {}
        for st in states:
            self.update(st)
        for retiree in retired:
            self.retire(*retiree)
        self.built = True

    def retire(self, instance: str, ended_at: float, partition: int) -> None:
        self._due[instance] = (ended_at + self.retention_s, partition)

    def due(self, now: float, owns: Callable[[int], bool]) -> list[str]:
        return [name for name, (when, part) in self._due.items() if when < now and owns(part)]


def forget_retired(
    store: StateStore, index: DueIndex, name: str, now: float, owns: Callable[[int], bool]
) -> bool:
    """A due state the store keeps out of memory (a finished workflow's): deleted once its
    retention is over, without reading it back. False: `name` is not such a state."""
    ended_at = store.retired_at(name)
    if ended_at is None:
        return False
    partition = index.partition_of(name)
    if partition is None or not owns(partition):
        index.drop(name)  # a moved workflow is its new owner's
    elif ended_at < now - index.retention_s:
        store.delete(name, partition)
        index.drop(name)
    return True
