"""The order of state changes: stamped on a changelog record when a store makes the change,
kept when a unit writes the records, so compaction always keeps a state's newest snapshot.

A unit gathers a transaction's records topic by topic, then those tied to no consumed
record (deadlines, next turns); and a change is staged with the record that caused it, so
an input's admission waits on its slot for its batch while a later change of the same
state may commit first. Either way an older snapshot could be written after a newer one,
and be the one compaction keeps.
"""

from __future__ import annotations

import itertools

from instanced_stream.kafka.publish import OutRecord

__all__ = ["ChangeOrder", "next_change"]

_CHANGES = itertools.count(1)  # one order across every store of the process


def next_change() -> int:
    """The order of a change being made now (`OutRecord.seq`, > 0)."""
    return next(_CHANGES)


class ChangeOrder:
    """What one unit writes of the changes it is given: in the order they were made, and
    never one older than a change of the same key it wrote before."""

    def __init__(self) -> None:
        self.written: dict[tuple[str, bytes], int] = {}  # per changelog key, its newest

    def __call__(self, records: list[OutRecord]) -> list[OutRecord]:
        """`records` (a transaction's) with the changes among them in the order made, each
        other record where it was, and a change older than one written before left out."""
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
        return out
