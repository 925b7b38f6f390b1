"""An instance on its way through a window (`Staged`): what the stager batches, the tier
it is given parks or windows, and the solved batch stages on the instance's unit."""

from __future__ import annotations

from dataclasses import dataclass, field

from instanced_stream.core.instance import Instance
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Staged"]


@dataclass(slots=True, eq=False)
class Staged:
    """An instance in a window, with the unit and slot its outcome is staged on."""

    instance: Instance
    unit: Unit
    slot: Slot | None  # None: a workflow's next turn (its input was committed before)
    text: bytes
    tokens: int | None = None
    changes: list[OutRecord] = field(default_factory=list)  # its admission's state change
