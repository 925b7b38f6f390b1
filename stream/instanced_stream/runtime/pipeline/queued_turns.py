"""The workflow turns on their way (`QueuedTurns`): at most one turn of an instance is in a
window or a batch at a time. The stager adds a turn when it offers it; dispatch marks it
done when its batch ends, staged or not (runtime/pipeline/dispatch.py)."""

from __future__ import annotations

from collections.abc import Iterable

from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.units.unit import Unit

__all__ = ["QueuedTurns"]


class QueuedTurns:
    """Instances whose next turn is on its way, each with the unit it was offered on. A
    turn offered on a unit dropped since (revoked, failed) holds nothing back: the
    partition's next unit here offers it again (it used to wait for a turn never run)."""

    def __init__(self) -> None:
        self.by_instance: dict[str, Unit] = {}

    def add(self, instance: str, unit: Unit) -> bool:
        """Whether the turn is to be offered now: its unit is held, and no turn of the
        instance is on its way on a unit that is."""
        queued = self.by_instance.get(instance)
        if not unit.held or (queued is not None and queued.held):
            return False
        self.by_instance[instance] = unit
        return True

    def done(self, items: Iterable[Staged]) -> None:
        """These items' turns are no longer on their way."""
        for item in items:
            if self.by_instance.get(item.instance.id) is item.unit:
                del self.by_instance[item.instance.id]
