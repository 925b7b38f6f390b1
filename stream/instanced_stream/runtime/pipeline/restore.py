"""The restore of a unit's state store: run by the unit's open task, outside the
assignment callback (see Membership), so the group's heartbeats go on however long it
takes; how far each restore got, for readiness and the live page.

A store is restored before it joins the owned ones (nothing reads it half restored);
each unreadable changelog record is quarantined with the unit's first commit (its dead
letter and its key's tombstone, one transaction); only the restored partition's states
enter the deadline index (in chunks, `DueIndex.reindex`), the other partitions' stay where
they were; a closed unit's partition leaves it.

It is the pipeline's, not the state's: it brings a partition back into the pipeline
(stages its quarantine letters on the unit, indexes deadlines, resumes the workflows'
next turns through `Flows`), and `runtime/state` sits below both the units and the
pipeline. Reading the changelog, and which reads wait for a turn, is the state's
(`state.changelog.ChangelogReader`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from instanced_stream.core.instance import Instance
from instanced_stream.runtime.pipeline.workflows import Flows
from instanced_stream.runtime.state.changelog import AT_ONCE
from instanced_stream.runtime.state.idea_tally import IdeaShare
from instanced_stream.runtime.state.store import UnitStore
from instanced_stream.runtime.units.unit import Unit

__all__ = ["KEEP_S", "Restores"]

log = logging.getLogger("stream.store")

KEEP_S = 300.0  # how long a closed unit's store is kept for its partition's return


class Restores:
    """The stores being restored, by partition."""

    def __init__(self, flows: Flows, bootstrap: str, keep_s: float = KEEP_S) -> None:
        self.flows = flows
        self.bootstrap = bootstrap
        self.keep_s = keep_s
        self.running: dict[int, UnitStore] = {}
        # The large reads' turns (`changelog.AT_ONCE`; a small read never waits).
        self._reading = asyncio.Semaphore(AT_ONCE)
        self.kept: dict[int, tuple[UnitStore, float]] = {}  # closed units' stores, since

    def keep(self, partition: int) -> None:
        """The store of a closed unit stays a while: if the partition comes back here (a
        failed unit reopened, a move undone), only the changelog's delta is read."""
        store = self.flows.stores.by_partition.get(partition)
        self.flows.stores.drop(partition)
        self.flows.workflow.index.clear(partition)  # indexed again if it comes back
        now = time.monotonic()
        self.kept = {p: (s, at) for p, (s, at) in self.kept.items() if now - at < self.keep_s}
        if store is not None:
            self.kept[partition] = (store, now)

    def progress(self, partition: int) -> int:
        """Changelog records the restore of `partition` has read so far."""
        store = self.running.get(partition)
        return store.restored if store is not None else 0

    async def restore(self, unit: Unit) -> list[Instance]:
        """Restores the store of `unit`'s partition and adds it to the owned ones; returns
        the instances waiting for a turn."""
        p = unit.partition
        kept, _ = self.kept.pop(p, (None, 0.0))
        store = kept or UnitStore(self.flows.changelog, p, self.flows.max_bytes)
        self.running[p] = store
        started = time.monotonic()
        try:
            states = await store.restore(self.bootstrap, self._reading)
        finally:
            self.running.pop(p, None)
        self.flows.stores.add(store)
        first = self.flows.quarantined(store)
        if first.records:
            self.flows.stage(unit, None, first)
        workflow = self.flows.workflow
        # Before any await: no expiry tick sees this store unindexed (it would index
        # every store at once). The retired states are due at the end of their retention.
        await workflow.index.reindex(p, store.peek(), store.retired())
        ready = []
        for n, st in enumerate(store.peek()):  # read only: no copy of each state
            if n % 1000 == 999:
                await asyncio.sleep(0)  # the heartbeats and the other units go on
            nxt = workflow.next_turn(st)
            if nxt is not None:
                ready.append(nxt)
        unit.written = self.flows.stores.written
        # Each commit's changes counted on the plan's Idea Process, in that commit.
        unit.annex = IdeaShare(
            store.ideas,
            self.flows.changelog,
            self.flows.builder.topics.ideas,
            p,
            lambda: self.flows.workflow.spec.plan,
        )
        log.info(
            "partition %d: %d states restored in %.1fs (%s, %d records read, %d quarantined), "
            "%d workflows resume their next turn",
            p,
            states,
            time.monotonic() - started,
            "the delta" if kept else "all",
            store.restored,
            len(first.planned.records),
            len(ready),
        )
        return ready
