"""Staging: the one writer of an item's outcome. A solved batch's records go onto the
units of its items' partitions, each item's on its own slot (`stage`); a record whose
outcome admission or the replies knew at once (`Settled`) likewise (`settle`). Its place
in an item's walk: docs/architecture.md, "The walk of one item". An item whose unit was
dropped meanwhile stages nothing: its partition's next owner redoes it, from the last
commit.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from instanced_stream.core.instance import Instance
from instanced_stream.kafka.records import OutRecord
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import (
    RecordBuilder,
    oversized,
)
from instanced_stream.runtime.pipeline.outcomes.size_guard import Replacement
from instanced_stream.runtime.pipeline.outcomes.tally import Tally
from instanced_stream.runtime.pipeline.solved import Solved
from instanced_stream.runtime.pipeline.staged import Settled, Staged
from instanced_stream.runtime.pipeline.tier import Tier
from instanced_stream.runtime.pipeline.workflows import Flows
from instanced_stream.runtime.units.unit import Unit
from instanced_stream.settings import Settings

__all__ = ["Staging"]

log = logging.getLogger("stream.processor")


class Staging:
    """Puts solved batches onto their items' units, and counts what their records mean."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics,
        builder: RecordBuilder,
        tier: Tier,
        flows: Flows | None,
        ready: Callable[[Unit, list[Instance]], None] | None = None,
    ) -> None:
        self.settings = settings
        # Where the next turns a staged turn made go (the service's queue of turns, as
        # for results and approvals); None: nobody takes them (a rig that looks itself).
        self.ready = ready
        self.metrics = metrics
        self.builder = builder
        self.tier = tier
        self.flows = flows
        self.count = Tally(metrics)  # the one counter of what records mean
        # The units' `Replace` (a record the broker refused: its item's dead letter). Built
        # below the units (outcomes/size_guard.py), so a commit never calls back up here.
        self.replacement = Replacement(settings.max_output_bytes, builder, self.count)

    def settle(self, settled: Settled) -> None:
        """A record's outcome known before any window, written on its slot and counted.
        Raises `UnitGone` when its unit no longer serves (nothing is counted then)."""
        settled.unit.finish(settled.slot, settled.planned.records)
        self.count(settled.planned)

    def stage(self, batch_id: str, items: list[Staged], solved: Solved) -> None:
        """Each item's records, and its turn's change of state, onto its own slot; a record
        too large for the broker is replaced by a dead letter for its item before it is
        staged."""
        planned = solved.planned
        # Where each item was read, as its records name it (`OutRecord.origin`).
        by_origin = dict(_origin(i) for i in items)
        owned: dict[int, list[OutRecord]] = defaultdict(list)
        loose: list[OutRecord] = []  # about the batch, not one item (a whole-batch opinion)
        for rec in planned.records:
            item = by_origin.get(rec.origin) if rec.origin else None
            if item is None:
                loose.append(rec)
                continue
            if len(rec.value) + len(rec.key or b"") > self.settings.max_output_bytes:
                letter = oversized(rec, item.instance, self.settings.max_output_bytes, batch_id)
                too_large = self.builder.letter(letter)
                self.count(too_large)
                owned[id(item)].extend(too_large.records)
                continue
            owned[id(item)].append(rec)
        self.count(planned)
        lines = self.tier.settled(items)
        staged = 0
        for item in items:
            if not item.unit.held:
                continue  # its partition's store is gone too: the new owner redoes it
            records = [*item.changes, *owned.get(id(item), []), *lines.get(id(item), [])]
            ready: list[Instance] = []
            if self.flows is not None and solved.change is not None:
                change = self.flows.commit(solved.change, item.instance)
                self.count(change.planned)
                records += change.records
                ready = change.ready
            if item.slot is None:
                item.unit.stage(records)
            else:
                item.unit.finish(item.slot, records)
            staged += 1
            if ready and self.ready is not None:
                self.ready(item.unit, ready)
        if loose:
            held = next((i.unit for i in items if i.unit.held), None)
            if held is not None:
                held.stage(loose)
        if staged < len(items):
            log.info(
                "batch %s: %d items of partitions no longer owned here are left to their owner",
                batch_id,
                len(items) - staged,
            )


def _origin(item: Staged) -> tuple[tuple[str, int, int], Staged]:
    at = item.instance.source
    return (at.topic, at.partition, at.offset), item
