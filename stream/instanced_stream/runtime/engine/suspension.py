"""Suspended units: what a revocation leaves until the next assignment says whether each
partition stays here (docs/architecture.md; DESIGN section 9, after Kafka Streams'
TaskManager). The eager protocol revokes every partition at every rebalance, even those
that come straight back; closing and reopening them restored every store and asked the
model again for every batch in flight. So a revoked unit commits its finished prefix and
is suspended: its store, its producer and its batches in flight are kept, and its commit
loop goes on (batches that finish meanwhile are staged and committed). If its partition
is assigned here again, it resumes where it was, with nothing restored and nothing asked
again; if not, it is closed, and what it had not committed is its next owner's to redo.

Exactly once holds without checking who owned the partition in between: had another
member owned it (this one put out of the group meanwhile), that member's producer, with
the same transactional id, fenced this unit's, so its next commit fails and the unit is
replaced from the committed offsets and a restored store.
"""

from __future__ import annotations

import logging

from instanced_stream.runtime.engine.unit import Unit

__all__ = ["Suspended"]

log = logging.getLogger("stream.membership")


class Suspended:
    def __init__(self) -> None:
        self.by_partition: dict[int, Unit] = {}

    async def suspend(self, units: list[Unit]) -> None:
        """Commits each unit's finished prefix, and keeps it."""
        for unit in units:
            try:
                await unit.commit()
            except Exception as exc:  # the unit is void: replaced if its partition returns
                log.warning("partition %d: commit on revocation failed: %r", unit.partition, exc)
            self.by_partition[unit.partition] = unit

    def settle(self, assigned: set[int]) -> tuple[list[Unit], list[Unit]]:
        """Given the new assignment: the suspended units to resume (still able to commit)
        and those to close (moved away, or failed meanwhile)."""
        back: list[Unit] = []
        gone: list[Unit] = []
        for p, unit in sorted(self.by_partition.items()):
            (back if p in assigned and unit.alive else gone).append(unit)
        self.by_partition.clear()
        return back, gone
