"""The order of state changes: stamped on a changelog record when a store makes the change,
kept when a unit writes the records, so compaction always keeps a state's newest snapshot.

A unit gathers a transaction's records topic by topic, then those tied to no consumed
record (deadlines, next turns); and a change is staged with the record that caused it, so
an input's admission waits on its slot for its batch while a later change of the same
state may commit first. Either way an older snapshot could be written after a newer one,
and be the one compaction keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from instanced_stream.kafka.records import OutRecord

__all__ = ["ChangeOrder", "Open", "last_change", "next_change"]

_last = 0  # one order across every store of the process


def next_change() -> int:
    """The order of a change being made now (`OutRecord.seq`, > 0)."""
    global _last
    _last += 1
    return _last


def last_change() -> int:
    """The order of the last change made so far."""
    return _last


class Open(Protocol):
    """A consumed record not yet committed (a unit's `Slot`): every change it causes is
    made after it was consumed, so is newer than `since`."""

    since: int


class ChangeOrder:
    """What one unit writes of the changes it is given: in the order they were made, and
    never one older than a change of the same key it wrote before."""

    def __init__(self) -> None:
        self.written: dict[tuple[str, bytes], int] = {}  # per changelog key, its newest
        self._bound = 1024  # the size of `written` at which it is pruned next

    def __call__(
        self, records: list[OutRecord], still_open: Iterable[Iterable[Open]] = ()
    ) -> list[OutRecord]:
        """`records` (a transaction's) with the changes among them in the order made, each
        other record where it was, and a change older than one written before left out.
        `still_open`: the records consumed and not yet committed, whose changes are the
        only ones still to come that can be older than one written now."""
        changes = sorted((r for r in records if r.seq), key=lambda r: r.seq)
        if not changes:
            return records
        made = iter(changes)
        out: list[OutRecord] = []
        for r in (next(made) if r.seq else r for r in records):
            if r.seq and r.key is not None:
                if r.seq < self.written.get((r.topic, r.key), 0):
                    continue  # its newer snapshot is written already
                self.written[(r.topic, r.key)] = r.seq
            out.append(r)
        if len(self.written) > self._bound:  # after these: they are no longer to come
            self._prune(still_open)
        return out

    def _prune(self, still_open: Iterable[Iterable[Open]]) -> None:
        """Forgets the keys whose newest written change is older than every change still
        to come: none of those can be beaten by an older one."""
        horizon = min((s.since for slots in still_open for s in slots), default=_last)
        self.written = {k: seq for k, seq in self.written.items() if seq > horizon}
        self._bound = max(1024, 2 * len(self.written))
