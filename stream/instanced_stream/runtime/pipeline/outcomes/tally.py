"""The one counter of what outcome records mean (`Tally`): their events into the metrics,
their decisions onto the live page. Staging counts through it what it writes; the units'
replacement of a record the broker refused (`size_guard.Replacement`) counts its dead
letter through the same one, so neither climbs back into the other."""

from __future__ import annotations

from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import Planned

__all__ = ["Tally"]


class Tally:
    """Counts planned records' events and decisions on `metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def __call__(self, planned: Planned) -> None:
        self.metrics.count(planned.events)
        self.metrics.decisions.extend(planned.decisions)
