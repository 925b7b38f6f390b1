"""The restore of a unit's state store: run by the unit's open task, outside the
assignment callback (see Membership), so the group's heartbeats go on however long it
takes; how far each restore got, for readiness and the live page.

A store is restored before it joins the owned ones (nothing reads it half restored);
each unreadable changelog record is quarantined with the unit's first commit (its dead
letter and its key's tombstone, one transaction); only the restored partition's states
enter the deadline index, the other partitions' stay where they were.
"""

from __future__ import annotations

import logging
import time

from instanced_stream.core.instance import Instance
from instanced_stream.runtime.engine.store import UnitStore
from instanced_stream.runtime.engine.unit import Unit
from instanced_stream.runtime.engine.workflows import Flows

__all__ = ["Restores"]

log = logging.getLogger("stream.store")


class Restores:
    """The stores being restored, by partition."""

    def __init__(self, flows: Flows, bootstrap: str) -> None:
        self.flows = flows
        self.bootstrap = bootstrap
        self.running: dict[int, UnitStore] = {}

    def progress(self, partition: int) -> int:
        """Changelog records the restore of `partition` has read so far."""
        store = self.running.get(partition)
        return store.restored if store is not None else 0

    async def restore(self, unit: Unit) -> list[Instance]:
        """Restores the store of `unit`'s partition and adds it to the owned ones; returns
        the instances waiting for a turn."""
        p = unit.partition
        store = self.running[p] = UnitStore(self.flows.changelog, p, self.flows.max_bytes)
        started = time.monotonic()
        try:
            states = await store.restore(self.bootstrap)
        finally:
            self.running.pop(p, None)
        self.flows.stores.add(store)
        first = self.flows.quarantined(store)
        if first.records:
            self.flows.stage(unit, None, first)
        workflow = self.flows.workflow
        ready = []
        for st in store.states():
            workflow.index.update(st)
            nxt = workflow.next_turn(st)
            if nxt is not None:
                ready.append(nxt)
        log.info(
            "partition %d: %d states restored in %.1fs (%d quarantined), "
            "%d workflows resume their next turn",
            p,
            states,
            time.monotonic() - started,
            len(first.planned.records),
            len(ready),
        )
        return ready
