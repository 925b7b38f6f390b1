"""Staging: a solved batch's records put onto the units of its items' partitions, each
item's on its own slot (docs/architecture.md, exactly once).

The last stage of one item's walk. Before it, in runtime/pipeline/:

- `Admission.record` (admission.py) reads the record into a `Staged` item and admits it
  (forwarding, recall, a redelivered turn skipped); the stager (stager.py) hands it to
  the tier (`Tier.offer`, tier.py), which adds it to the open window (`Windower.add`);
- the windower closes the window and calls `Dispatch.launch` (dispatch.py), where the
  batch is solved, retried and read back, and its turns made on a transaction
  (`Dispatch._run`, `Dispatch._solved`);
- the solved batch (`Solved`, a plain value) comes here: `Staging.stage`, which stores
  each item's turn (`Flows.commit`) with the item's records, on its slot.

Nothing here calls back into the stager: it is given the batch and returns nothing. The
units' producers call `Staging.replacement` when the broker refuses a record (its item's
dead letter instead), and admission counts its dead letters with
`Staging.count`. An item whose unit was dropped meanwhile stages nothing: its partition's
next owner redoes it, from the last commit.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from instanced_stream.kafka.records import OutRecord
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import (
    Planned,
    RecordBuilder,
    oversized,
    position,
)
from instanced_stream.runtime.pipeline.outcomes.size_guard import refused
from instanced_stream.runtime.pipeline.solved import Solved
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.pipeline.tier import Tier
from instanced_stream.runtime.pipeline.workflows import Flows
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
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.builder = builder
        self.tier = tier
        self.flows = flows

    def stage(self, batch_id: str, items: list[Staged], solved: Solved) -> None:
        """Each item's records, and its turn's change of state, onto its own slot; a record
        too large for the broker is replaced by a dead letter for its item before it is
        staged."""
        planned = solved.planned
        by_origin = {position(i.instance.source): i for i in items}
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
            if self.flows is not None and solved.change is not None:
                change = self.flows.commit(solved.change, item.instance)
                self.count(change.planned)
                records += change.records
            if item.slot is None:
                item.unit.stage(records)
            else:
                item.unit.finish(item.slot, records)
            staged += 1
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

    def replacement(self, record: OutRecord, said: str) -> list[OutRecord]:
        """Its item's dead letter, written instead of a record the broker refused (`said`)."""
        letters = refused([record], self.settings.max_output_bytes, self.builder, said)
        self.count(letters)
        return letters.records

    def count(self, planned: Planned) -> None:
        """Counts what the records mean (metrics, the live page's decisions)."""
        self.metrics.count(planned.events)
        self.metrics.decisions.extend(planned.decisions)
