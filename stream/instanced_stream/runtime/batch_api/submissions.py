"""The batch tier's part of the stager: what is submitted goes into the units' state, and
what a unit finds there after a crash or a rebalance is polled, not submitted again.

- Submitted: each line of a batch just created is recorded (`Ledger.submitted`) on the
  unit of every partition it asks about, committed with that unit's next transaction;
  the items' own slots stay open.
- Restored: a unit opened here reads its partition of the ledger; every line in it is
  registered with the model (`BatchModel.resume`). An input record a line asks about is
  parked instead of windowed, and once every item of the line is back, they are solved
  together in the line's order: the solver's first request asks about the same keys,
  and the model answers it from the batch already submitted. A re-ask's line follows
  the same way. Items parked longer than `_PARKED_S` (the rest of their line was
  committed, or is owned elsewhere now) are windowed as new.
- Settled: a window's outcomes carry the tombstones of its lines, on the slot of each
  partition's last item, so a line leaves the state only with its items' offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from instanced_stream.kafka.records import OutRecord
from instanced_stream.llm.batch_api import BatchModel
from instanced_stream.runtime.batch_api.ledger import Ledger
from instanced_stream.runtime.units.unit import Unit

if TYPE_CHECKING:
    from instanced_stream.runtime.pipeline.staged import Staged
    from instanced_stream.runtime.pipeline.tier import Windows

__all__ = ["Submissions"]

log = logging.getLogger("stream.processor")

# How long parked items wait for the rest of their line before they are asked anew.
_PARKED_S = 120.0


class Submissions:
    def __init__(
        self, ledger: Ledger, model: BatchModel, units: Callable[[int], Unit | None]
    ) -> None:
        self.ledger = ledger
        self.model = model
        self.units = units
        self.parked: dict[str, dict[str, Staged]] = {}  # custom id -> key -> item
        self.parked_at: dict[str, float] = {}
        self.resumed = 0  # lines answered from a batch submitted before a restart
        model.on_submitted = self.submitted

    async def offer(self, item: Staged, windows: Windows) -> None:
        """The stager's `Tier`: an item whose line is in a batch waits for it."""
        if not await self.park(item, windows):
            await windows.add(item)

    async def restore(self, bootstrap: str, partition: int) -> int:
        """A unit opened here: the lines its partition recorded, polled from now on."""
        lines = await self.ledger.restore(bootstrap, partition)
        for line in lines:
            self.model.resume(line.keys, line.batch, line.custom_id)
        return len(lines)

    def drop(self, partition: int) -> None:
        self.ledger.drop(partition)

    def submitted(self, batch_id: str, lines: list[tuple[str, tuple[str, ...]]]) -> None:
        for partition, records in self.ledger.submitted(batch_id, lines).items():
            unit = self.units(partition)  # a running unit: held
            if unit is not None:
                unit.stage(records)

    async def park(self, item: Staged, windows: Windows) -> bool:
        """Whether the item waits for its line's batch (submitted before a restart)."""
        key = item.instance.key
        line = self.ledger.first_line(key)
        if line is None:
            return False
        group = self.parked.setdefault(line.custom_id, {})
        self.parked_at.setdefault(line.custom_id, time.monotonic())
        group[key] = item
        if all(k in group for k in line.keys):
            del self.parked[line.custom_id]
            del self.parked_at[line.custom_id]
            self.resumed += 1
            await windows.launch([group[k] for k in line.keys], "resumed")
        return True

    async def sweep(self, windows: Windows) -> int:
        """Windows the items whose line cannot be completed here; returns how many."""
        now = time.monotonic()
        released = 0
        for custom_id, since in list(self.parked_at.items()):
            if now - since < _PARKED_S:
                continue
            group = self.parked.pop(custom_id)
            del self.parked_at[custom_id]
            log.warning(
                "batch line %s: %d items back, the rest never came; asked anew",
                custom_id,
                len(group),
            )
            # Their new line replaces it.
            for partition, tombstones in self.ledger.settled(list(group)).items():
                unit = self.units(partition)  # a running unit: held
                if unit is not None:
                    unit.stage(tombstones)
            for item in group.values():
                if item.unit.held:
                    await windows.add(item)
                    released += 1
        return released

    def settled(self, items: list[Staged]) -> dict[int, list[OutRecord]]:
        """The tombstones of these items' lines, keyed by id() of the item whose slot
        carries them (each partition's last); where no slot can, staged on the unit."""
        keys = [i.instance.key for i in items]
        self.model.forget(keys)
        out: dict[int, list[OutRecord]] = {}
        for partition, tombstones in self.ledger.settled(keys).items():
            slots = [
                i
                for i in items
                if i.slot is not None and i.unit.held and i.unit.partition == partition
            ]
            if slots:
                last = max(slots, key=lambda i: i.slot.offset if i.slot else -1)
                out.setdefault(id(last), []).extend(tombstones)
                continue
            unit = self.units(partition)  # a running unit: held
            if unit is not None:
                unit.stage(tombstones)
        return out

    def in_flight(self) -> list[float]:
        return self.model.in_flight()
